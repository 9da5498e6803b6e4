"""The exactly-once bandit trainer as a detached, namespaced Ray actor (the agentic tutorial's trainer tier; extra
`ray`).

Each training step is a new task, often a new Ray job in a new process, so module globals do not survive between steps;
a detached actor does — across steps, step retries and driver crashes — for as long as its cluster lives (in production
a reusable cluster scoped to the run). `attach_ray_trainer` is get-or-create by (namespace, name), and the handle it
returns implements `rl.agentic.bandit.PolicyTrainer`, so `rl.agentic.tiers.TrainerTier(attach_ray_trainer)` is the
the tutorial's trainer tier. The actor wraps `BanditTrainer`, ledger included: a re-sent step returns its recorded
weights, a conflicting one raises `StepPayloadConflictError` here, in the caller.

`ray` is imported inside the functions, so importing this module needs no Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl.agentic.bandit import BanditTrainer
from rl.errors import RayUnavailableError, TrainerLedgerError
from rl.types import Reward, TrainerInfo, Weights

POLICY_ACTOR = "agentic-policy-trainer"
RAY_NAMESPACE = "flyte-rl-agentic"


class _PolicyTrainerActor:
    """Actor body: a `BanditTrainer` whose identity is the actor's process id. Payloads cross as plain dicts."""

    def __init__(self, world_ids: list[str]) -> None:
        self._trainer = BanditTrainer(world_ids)

    def update(self, step: int, rewards: list[dict[str, Any]], lr: float) -> dict[str, Any]:
        weights = self._trainer.update(step, [Reward.model_validate(r) for r in rewards], lr)
        return weights.model_dump()

    def weights(self) -> dict[str, Any]:
        return self._trainer.weights().model_dump()

    def info(self) -> dict[str, Any]:
        return self._trainer.info().model_dump()

    def world_ids(self) -> list[str]:
        return list(self._trainer.world_ids)


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailableError("the Ray trainer needs ray: install the extra with `pip install -e .[ray]`") from exc
    return ray


class RayTrainerHandle:
    """A `PolicyTrainer` over the detached actor. Ledger errors raised in the actor are re-raised here, unwrapped."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def _get(self, ref: Any) -> Any:
        ray = _ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, TrainerLedgerError | ValueError):
                raise cause from exc
            raise

    def update(self, step: int, rewards: Sequence[Reward], lr: float) -> Weights:
        payload = [r.model_dump() for r in rewards]
        return Weights.model_validate(self._get(self.actor.update.remote(step, payload, lr)))

    def weights(self) -> Weights:
        return Weights.model_validate(self._get(self.actor.weights.remote()))

    def info(self) -> TrainerInfo:
        return TrainerInfo.model_validate(self._get(self.actor.info.remote()))


def attach_ray_trainer(
    world_ids: Sequence[str], *, name: str = POLICY_ACTOR, namespace: str = RAY_NAMESPACE
) -> RayTrainerHandle:
    """Re-attach to the named detached trainer actor, creating it on first use; Ray must already be initialised.

    Raises `TrainerMismatchError` when an actor of that name exists for other worlds.
    """
    ray = _ray()
    if not ray.is_initialized():
        raise RuntimeError("Ray is not initialised: call ray.init(...) (or connect to the run's cluster) first")
    actor_class = ray.remote(num_cpus=0)(_PolicyTrainerActor)
    actor = actor_class.options(name=name, namespace=namespace, lifetime="detached", get_if_exists=True).remote(
        list(world_ids)
    )
    handle = RayTrainerHandle(actor)
    have = handle._get(actor.world_ids.remote())
    BanditTrainer(have, identity=0).check_world_ids(world_ids)
    return handle


def kill_ray_trainer(*, name: str = POLICY_ACTOR, namespace: str = RAY_NAMESPACE) -> bool:
    """Kill the named detached actor (it outlives every job otherwise); False when there was none."""
    ray = _ray()
    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    ray.kill(actor, no_restart=True)
    return True
