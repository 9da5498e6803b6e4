"""Peak memory (RSS) of `rl demo grpo --model smollm2`'s trainer step and torch sampler on the CPU, each in a fresh
process, against `rl plan`'s terms (`rl.memory_plan.trainer_plan`, the function `rl plan` prints) for the same model
and shape: 4 prompts x 8 samples, up to 12 new tokens, `rl.deploy.local.REAL_MODEL_TRAINER` (float32 base, eager
attention, LoRA r8 on q/k/v/o, one micro-batch).

Each process records its RSS after its imports, after loading (the model's share: the difference), and its peak over
the work (the step's or the sampling's share: peak minus the RSS before it; the peak is reset between phases by
writing 5 to /proc/self/clear_refs, Linux's reset of VmHWM and ru_maxrss). A first process writes adapter version 0;
a last one runs the trainer's step again under torch's profiler, whose allocator events give the step's peak in
tensor bytes (what tests/test_memory_plan.py checks the plan against on small models), so the allocator's overhead in
RSS can be told from the formula's error. Linux only (/proc). docs/benchmarks.md has the figures.

    python scripts/real_model_memory.py [--model smollm2|DIR] [--threads 2] [--mmap-threshold BYTES]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rl.models.opened_model import ModelDir, open_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS, SAMPLES, MAX_TOKENS = 4, 8, 12  # the demo's iteration with --model (rl.commands.demo, rl.deploy.demo)


def rss() -> int:
    """This process's resident set now, in bytes."""
    return _status("VmRSS")


def rss_file() -> int:
    """The file-backed part of the resident set (mapped files: a float32 model's safetensors, read in place)."""
    return _status("RssFile")


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}: this script needs Linux")


def touch(model: Any) -> None:
    """Read every parameter once: weights mapped from the safetensors file are resident only once read."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.sum()


def peak() -> int:
    """The resident set's peak since start or the last `reset_peak`, in bytes (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, and with it ru_maxrss, to the current RSS


def init_adapter(model_dir: ModelDir, store: Path) -> dict[str, Any]:
    """Adapter version 0 as the demo's trainer writes it, in the artifact store `store`."""
    from rl.deploy.local import REAL_MODEL_TRAINER
    from rl.storage.artifacts import LocalArtifacts
    from rl.trainer.peft_trainer import PeftTrainer

    result = asyncio.run(PeftTrainer(model_dir, LocalArtifacts(store), REAL_MODEL_TRAINER).init_adapter(seed=0))
    return asdict(result.adapter)


def sampler(model_dir: ModelDir, store: Path, ref: dict[str, str], threads: int, rollouts_out: Path) -> dict[str, Any]:
    """One iteration's groups from `TorchSampler.generate_groups`; the rollouts go to `rollouts_out` for the trainer."""
    from rl.problems import Addition
    from rl.samplers.torch_sampler import TorchSampler
    from rl.storage.artifacts import LocalArtifacts
    from rl.types import ArtifactRef, RolloutRequest

    found: dict[str, Any] = {"rss_imports": rss(), "file_imports": rss_file()}
    engine = TorchSampler(model_dir, LocalArtifacts(store), threads=threads)
    touch(engine.adapters.base)  # the base AdapterCache keeps; MergedBase's working copy already read it
    found |= {"rss_loaded": rss(), "file_loaded": rss_file(), "peak_load": peak()}
    reset_peak()
    adapter = ArtifactRef(**ref)
    requests = [
        RolloutRequest(
            group_id=i, prompt=p, n=SAMPLES, adapter=adapter, policy_version=0, seed=i, max_tokens=MAX_TOKENS
        )
        for i, p in enumerate(Addition().train_prompts()[:PROMPTS])
    ]
    groups = asyncio.run(engine.generate_groups(requests))
    found |= {"rss_after": rss(), "peak_work": peak()}
    rollouts = [r for group in groups for r in group]
    rollouts_out.write_text(json.dumps([r.to_dict() for r in rollouts]))
    found |= {
        "rows": len(rollouts),
        "prompt_tokens": max(len(r.prompt_token_ids) for r in rollouts),
        "completion_tokens": max(len(r.token_ids) for r in rollouts),
    }
    return found


def trainer(
    model_dir: ModelDir, store: Path, ref: dict[str, str], threads: int, rollouts_in: Path, allocations: bool
) -> dict[str, Any]:
    """One cold train step on the sampled rollouts, as `PeftTrainer` runs it (`prepare_step`, `run_step`). Rewards
    alternate 0, 1 within each group, so every sample contributes: one micro-batch of all 32, the demo's largest."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rl.deploy.local import REAL_MODEL_TRAINER
    from rl.storage.artifacts import LocalArtifacts
    from rl.trainer.step import pinned_threads, prepare_step, run_step
    from rl.types import ArtifactRef, Rollout, TrainBatch

    found: dict[str, Any] = {"rss_imports": rss(), "file_imports": rss_file()}
    config = replace(REAL_MODEL_TRAINER, threads=threads)
    adapter = ArtifactRef(**ref)
    files = asyncio.run(LocalArtifacts(store).get(adapter))
    rollouts = [Rollout.from_dict(d) for d in json.loads(rollouts_in.read_text())]
    rewards = [float(i % 2) for i in range(len(rollouts))]
    batch = TrainBatch(step=0, rollouts=rollouts, rewards=rewards, adapter=adapter, optimizer_state=None, new_version=1)
    with pinned_threads(config.threads), torch.random.fork_rng(devices=[]):
        prepared = prepare_step(model_dir, batch, config, files, None)
        found["file_unread"] = rss_file()
        touch(prepared.model)  # the step reads every weight: count them in the load, not in the step's peak
        found |= {"rss_loaded": rss(), "file_loaded": rss_file(), "peak_load": peak()}
        reset_peak()
        if not allocations:
            run_step(batch, prepared, config)
        else:
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                run_step(batch, prepared, config)
            events = sorted(
                (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
            )
            live = top = 0
            for _, nbytes in events:
                live += nbytes
                top = max(top, live)
            found["allocated_peak"] = top
    found |= {"rss_after": rss(), "peak_work": peak(), "contributing": len(prepared.contributing)}
    return found


def child(role: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `role` in a fresh interpreter; its last stdout line is its JSON result."""
    command = [sys.executable, __file__, "--role", role, *args]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise SystemExit(f"{role} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gib(n: float) -> str:
    return f"{n / (1 << 30):.3f}"


def table(model_dir: ModelDir, s: dict[str, Any], t: dict[str, Any], a: dict[str, Any], threads: int) -> list[str]:
    """The comparison, as a markdown table (GiB), and the lines that explain it."""
    from rl.deploy.local import REAL_MODEL_TRAINER
    from rl.memory_plan import ModelArch, lora_parameters, trainer_plan

    arch = ModelArch.from_hf_config(model_dir.json("config.json"))  # as the door read it
    rows, prompt, completion = s["rows"], s["prompt_tokens"], s["completion_tokens"]
    plan = trainer_plan(
        arch, REAL_MODEL_TRAINER, prompt_tokens=prompt, completion_tokens=completion, samples=rows, budget=0
    ).terms
    n_lora = lora_parameters(arch, REAL_MODEL_TRAINER.lora_rank, REAL_MODEL_TRAINER.target_modules)
    step = plan["optimizer"] + plan["activations"] + plan["logits"]
    base = arch.parameters() * 4  # float32: what the plan's weights term counts for this base, LoRA aside
    compared = [
        (
            "trainer",
            "weights: base + LoRA (RSS after reading them)",
            plan["weights"],
            t["rss_loaded"] - t["rss_imports"],
        ),
        ("trainer", "step: optimizer + activations + logits (RSS)", step, t["peak_work"] - t["rss_loaded"]),
        ("trainer", "step, allocator peak (torch profiler)", step, a["allocated_peak"]),
        ("trainer", "peak, model's share (peak - imports)", plan["weights"] + step, t["peak_work"] - t["rss_imports"]),
        ("sampler", "weights: base (RSS after load)", base, s["rss_loaded"] - s["rss_imports"]),
        ("sampler", "peak, model's share (peak - imports)", base, s["peak_work"] - s["rss_imports"]),
    ]
    # What sampling holds beyond the weights (no `rl plan` term: it plans vLLM on a GPU, not this sampler).
    prefill_logits = rows * prompt * arch.vocab * 4  # [rows, P, V] float32: the prompt forward's logits, every position
    kv_cache = rows * (prompt + completion) * arch.kv_bytes_per_token(4)
    targets = REAL_MODEL_TRAINER.target_modules
    originals = arch.layers * sum(i * o * 4 for name, (i, o) in arch.module_shapes().items() if name in targets)
    out = [
        f"SmolLM2-135M-Instruct ({arch.parameters() / 1e6:.1f} M parameters, {n_lora / 1e6:.2f} M LoRA), {rows} rows "
        f"of {prompt} + up to {completion} tokens, {t['contributing']} contributing, {threads} thread(s) per process",
        "plan terms: " + ", ".join(f"{k} {gib(v)}" for k, v in plan.items()) + " GiB",
        "",
        "| task | term | plan (GiB) | measured (GiB) | plan / measured |",
        "|---|---|---:|---:|---:|",
    ]
    out += [f"| {task} | {term} | {gib(p)} | {gib(m)} | {p / m:.2f} |" for task, term, p, m in compared]
    out += [
        "",
        f"trainer RSS: {gib(t['rss_imports'])} after imports, {gib(t['rss_loaded'])} after loading and reading the "
        f"weights ({gib(t['file_loaded'] - t['file_imports'])} of it file-backed, "
        f"{gib(t['file_unread'] - t['file_imports'])} before they were read), peak {gib(t['peak_work'])}, "
        f"{gib(t['rss_after'])} after the step",
        f"sampler RSS: {gib(s['rss_imports'])} after imports, {gib(s['rss_loaded'])} after loading "
        f"({gib(s['file_loaded'] - s['file_imports'])} of it file-backed), peak {gib(s['peak_work'])} while sampling "
        f"(+{gib(s['peak_work'] - s['rss_loaded'])})",
        f"sampling's own terms: prefill logits {gib(prefill_logits)}, KV cache {gib(kv_cache)}, the merged layers' "
        f"original weights {gib(originals)}: {gib(prefill_logits + kv_cache + originals)} GiB",
    ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each process (default 2, the demo's)")
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        default=None,
        help="set glibc's MALLOC_MMAP_THRESHOLD_ (bytes) in the measured processes: blocks over it are returned to "
        "the OS when freed, so RSS follows the allocations (default: glibc's own, a threshold that grows to 32 MiB)",
    )
    parser.add_argument("--role", default=None, help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role is not None:  # a child: one measurement, one JSON line
        model_dir, store, *rest = args.args
        model_dir, store = open_model(Path(model_dir)), Path(store)  # this child's door
        if args.role == "init":
            result = init_adapter(model_dir, store)
        elif args.role == "sampler":
            result = sampler(model_dir, store, json.loads(rest[0]), args.threads, Path(rest[1]))
        else:
            result = trainer(
                model_dir, store, json.loads(rest[0]), args.threads, Path(rest[1]), args.role == "allocations"
            )
        print(json.dumps(result))
        return
    from rl.models.pretrained import resolve_model

    model_dir = resolve_model(args.model)
    threads = ["--threads", str(args.threads)]
    with tempfile.TemporaryDirectory(prefix="rl-memory-") as tmp:
        store, rollouts = Path(tmp) / "artifacts", Path(tmp) / "rollouts.json"
        ref = json.dumps(child("init", str(model_dir.where), str(store)))
        env = {} if args.mmap_threshold is None else {"MALLOC_MMAP_THRESHOLD_": str(args.mmap_threshold)}
        s = child("sampler", *threads, str(model_dir.where), str(store), ref, str(rollouts), env=env)
        t = child("trainer", *threads, str(model_dir.where), str(store), ref, str(rollouts), env=env)
        a = child("allocations", *threads, str(model_dir.where), str(store), ref, str(rollouts))
    print("\n".join(table(model_dir, s, t, a, args.threads)))


if __name__ == "__main__":
    main()
