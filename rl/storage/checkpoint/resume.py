"""Resuming the GRPO driver from its checkpoint: load and check it against this run (configuration, artifacts,
rollout buffer), and save the next one."""

from __future__ import annotations

from typing import Any

from rl.errors import CheckpointConfigMismatchError, MissingAdapterError
from rl.identity import canonical
from rl.protocols import Artifacts, CheckpointStore
from rl.storage.checkpoint.format import CheckpointEncoder, DriverState, decode_state


async def load_state(store: CheckpointStore, config: Any, artifacts: Artifacts) -> DriverState | None:
    """The state to resume from, or None for a fresh run. Raises a `CheckpointError` subtype when it can't resume."""
    blob = await store.load()
    if blob is None:
        return None
    path = getattr(store, "path", None)  # a file store names its file, so the message can
    state = decode_state(blob, str(path) if path is not None else "the driver checkpoint")
    if state.config_digest != config.digest():
        raise CheckpointConfigMismatchError(
            f"the checkpoint was written by a run with configuration {state.config_digest[:12]}, this run has "
            f"{config.digest()[:12]}{_differing_fields(state.config, config)}; resume with the original "
            "configuration, or start a new run (a new run has its own checkpoint)"
        )
    for what, ref in (("adapter", state.adapter), ("optimizer state", state.optimizer_state)):
        if not await artifacts.exists(ref):
            raise MissingAdapterError(
                f"the checkpoint at iteration {state.iteration} names {what} {ref.uri}, which the artifact store no "
                "longer has; restore it or start a new run"
            )
    return state


def _differing_fields(recorded: dict[str, Any] | None, config: Any) -> str:
    """` (iterations: checkpoint 120, this run 200)`, or nothing for a checkpoint that predates recording its fields."""
    if not isinstance(recorded, dict):
        return ""
    current = canonical(config)
    names = sorted(set(recorded) | set(current))
    diffs = [
        f"{n}: checkpoint {_short(recorded.get(n))}, this run {_short(current.get(n))}"
        for n in names
        if recorded.get(n) != current.get(n)
    ]
    return f" ({'; '.join(diffs)})" if diffs else ""


def _short(value: Any) -> str:
    """`repr(value)`, cut to keep a message one readable line whatever a crafted checkpoint holds."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_recording(state: DriverState, *, buffered: bool) -> None:
    """Refuse to resume a run whose rollout buffer would then miss iterations.

    What a run records is part of its identity: a buffer turned on half way misses the iterations before it, and one
    turned off misses those after. A checkpoint is written only after its iteration's rollouts were appended, so a
    checkpoint's run kept a buffer exactly when it names a buffer version.
    """
    recorded = state.buffer_version is not None
    if recorded == buffered:
        return
    done = f"iterations 0..{state.iteration}" if state.iteration > 0 else "iteration 0"
    if recorded:
        raise CheckpointConfigMismatchError(
            f"field 'buffer' differs: the checkpoint's run kept its rollouts on the buffer ({done}), this run keeps "
            f"none, so the buffer would miss every iteration from {state.iteration + 1}; resume with the rollout "
            "buffer on (`rl demo grpo`: without --no-buffer), or start a new run"
        )
    raise CheckpointConfigMismatchError(
        f"field 'buffer' differs: the checkpoint's run kept no rollout buffer ({done}), this run keeps one, so the "
        f"buffer would miss {done}; resume without the buffer (`rl demo grpo`: --no-buffer), or start a new run"
    )


async def save_state(store: CheckpointStore, state: DriverState, encoder: CheckpointEncoder | None = None) -> None:
    """Save `state`'s checkpoint; `encoder`: the run's, which encodes each history row once (a fresh one otherwise)."""
    await store.save((encoder or CheckpointEncoder()).encode(state))
