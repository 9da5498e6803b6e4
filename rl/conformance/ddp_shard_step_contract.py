"""The multi-rank shard-step contract: the law of the function every DDP rank runs to turn its shard into gradients.

Subclass it and provide the one required fixture:

    class TestMyShardStep(DdpShardStepContract):
        @pytest.fixture
        def ddp_shard_step(self):
            return my_package.ddp.my_shard_step  # module-level: spawned ranks unpickle it

The law spawns 2 gloo ranks on localhost (CPU only) and checks even, uneven and empty shards in that one spawn. This
module imports neither torch nor `rl.trainer`: the law's body does, so the packaged suite stays importable without them.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from rl.conformance.support.contract_base import ContractBase, must_provide, tier

__all__ = ["DdpShardStepContract"]

WORLD_SIZE = 2
MAX_REL_ERR = 1e-5
"""The gradient's relative error against the single-process full-batch gradient: float32 summation order gives ~1e-7."""

EMPTY_SHARD_HINT = "a rank with an empty shard must still run the one synchronising backward"


@tier("ddp")
class DdpShardStepContract(ContractBase):
    """Law of the shard step `(ddp_model, sample_loss_fns, sync_forward) -> None`, like `rl.trainer.ddp.ddp_shard_step`.

    The step gets this rank's per-sample loss closures (each runs the wrapped model's forward and returns a 0-d loss,
    already scaled so that DDP's average over ranks gives the full-batch mean) and `sync_forward`, a forward through
    `DDP.forward` itself. It must leave in `.grad` the all-reduced gradient of every sample of every rank.

    Provide `ddp_shard_step`; `ddp_base_model_dir` (the tiny model by default) and `ddp_timeout_s` can be overridden.
    """

    @pytest.fixture
    def ddp_shard_step(self) -> Callable[..., None]:
        """Return the shard-step function under test: a module-level (picklable) function
        `(ddp_model, sample_loss_fns, sync_forward) -> None` like `rl.trainer.ddp.ddp_shard_step`."""
        raise must_provide(
            "DdpShardStepContract",
            "ddp_shard_step",
            "a module-level (picklable) function (ddp_model, sample_loss_fns, sync_forward) -> None like "
            "rl.trainer.ddp.ddp_shard_step; spawned gloo ranks unpickle it",
        )

    @pytest.fixture
    def ddp_base_model_dir(self) -> Path:
        """The base model the law's LoRA policy wraps; defaults to the tiny model (built once per process).

        An override must load with `rl.models.load_base_model`, accept PEFT's "all-linear" LoRA and have token ids 2-39.
        """
        from rl.conformance.support.tiny_model import tiny_base_model

        return tiny_base_model()

    @pytest.fixture
    def ddp_timeout_s(self) -> float:
        """The process group's collective timeout, in seconds.

        A rank that skips a collective leaves its peers waiting in it; gloo then fails them after this long, which is
        how a deadlock surfaces as a failing law. The tiny model's step takes well under a second, so 20 s is ample
        even on a loaded machine and keeps a deadlocking implementation's failure to about half a minute.
        """
        return 20.0

    def test_ddp_shard_step_syncs_once_on_every_rank_and_gives_the_full_batch_gradient(
        self, ddp_shard_step: Callable[..., None], ddp_base_model_dir: Path, ddp_timeout_s: float, rl_seed: int
    ) -> None:
        """On 2 gloo ranks, for an even split, an uneven split and an empty shard (one sample on two ranks): every
        rank runs exactly one synchronising forward-backward, the ranks run the same all-reduces, each rank's gradient
        equals the single-process full-batch gradient (relative error < 1e-5), and after one AdamW step the ranks hold
        identical parameters. A rank that skips the collective deadlocks its peer: that fails within `ddp_timeout_s`.
        """
        try:
            pickle.dumps(ddp_shard_step)
        except Exception as exc:
            pytest.fail(
                f"`ddp_shard_step` {ddp_shard_step!r} cannot be pickled ({exc}): it must be a module-level function, "
                "because the law's spawned ranks unpickle it",
                pytrace=False,
            )
        from rl.conformance.support.ddp_ranks import CASES, law_inputs, shard_step_cases
        from rl.trainer.ddp import run_local_ddp

        adapter, batch = law_inputs(Path(ddp_base_model_dir), rl_seed)
        try:
            per_rank = run_local_ddp(
                WORLD_SIZE,
                shard_step_cases,
                Path(ddp_base_model_dir),
                adapter,
                batch,
                CASES,
                ddp_shard_step,
                timeout_s=ddp_timeout_s,
            )
        except Exception as exc:  # a rank died (or hung outside a collective): no per-case results came back
            pytest.fail(
                f"the {WORLD_SIZE} gloo ranks did not finish the cases {[name for name, _ in CASES]}: "
                f"{type(exc).__name__}: {_last_lines(str(exc))}",
                pytrace=False,
            )
        problems = [p for name, indices in CASES for p in _case_problems(name, indices, per_rank, ddp_timeout_s)]
        if problems:
            pytest.fail("\n".join(problems), pytrace=False)


def _case_problems(
    name: str, indices: Sequence[int], per_rank: Sequence[Sequence[Mapping[str, Any]]], timeout_s: float
) -> list[str]:
    """What is wrong with one case across the ranks' results (empty when the case holds)."""
    results = [next((r for r in rank_results if r["case"] == name), None) for rank_results in per_rank]
    samples = f"{len(indices)} contributing sample{'' if len(indices) == 1 else 's'}"
    if any(r is None for r in results):
        return [f"case {name!r} ({samples}): not run, an earlier case broke the process group"]
    sizes = [len(r["shard"]) for r in results if r is not None]
    label = f"case {name!r} ({samples}, shard sizes {sizes} on ranks 0..{len(per_rank) - 1})"
    errors = {rank: str(r["error"]) for rank, r in enumerate(results) if r is not None and "error" in r}
    if errors:
        if any("timed out" in e.lower() or "timeout" in e.lower() for e in errors.values()):
            hint = f"; {EMPTY_SHARD_HINT}" if 0 in sizes else ""
            why = (
                f"the ranks timed out after {timeout_s:.0f} s waiting for each other in a collective (a deadlock): "
                f"every rank must run exactly one synchronising backward whatever its shard holds{hint}"
            )
        else:
            why = "the shard step raised"
        detail = "; ".join(f"rank {rank}: {_last_lines(e, 1)}" for rank, e in sorted(errors.items()))
        return [f"{label}: {why} ({detail})"]
    problems = []
    forwards = [r["counts"]["forward"] for r in results if r is not None]
    if any(f != 1 for f in forwards):
        problems.append(
            f"{label}: the ranks passed through DDP.forward {forwards} times; every rank must call `sync_forward` "
            "exactly once, for its one synchronising backward"
            + (f" ({EMPTY_SHARD_HINT})" if 0 in sizes and any(f == 0 for f in forwards) else "")
        )
    allreduces = [r["counts"]["allreduce"] for r in results if r is not None]
    if len(set(allreduces)) != 1 or min(allreduces) < 1:
        problems.append(
            f"{label}: the ranks ran {allreduces} gradient all-reduces; every rank must run the same ones, at least one"
        )
    for rank, r in enumerate(results):
        if r is not None and not r["max_rel_err"] < MAX_REL_ERR:
            problems.append(
                f"{label}: rank {rank}'s gradient differs from the single-process full-batch gradient by relative "
                f"error {r['max_rel_err']:.2e} (must be < {MAX_REL_ERR:.0e})"
            )
    if len({r["param_digest"] for r in results if r is not None}) != 1:
        problems.append(f"{label}: the ranks hold different parameters after the same AdamW step")
    if any(r is not None and r["expected_norm"] == 0 for r in results):
        problems.append(
            f"{label}: the full-batch gradient is zero, so the case checks nothing; `ddp_base_model_dir` must be a "
            "model on which the law's batch has a gradient"
        )
    return problems


def _last_lines(text: str, n: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-n:])
