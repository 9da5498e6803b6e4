"""What an implementation claims beyond the letter of the protocols, declared once as a frozen value.

A law that needs a capability asks for it with `require`; when the flag is False the law skips and says which flag, so
a report shows exactly what an implementation does not claim. Tests are never overridden to skip them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest


@dataclass(frozen=True)
class Capabilities:
    """Optional guarantees. Every flag defaults to True, the claim our loop makes: silence never passes a law.

    Set a flag to False to declare that your implementation lacks it; each law that needs it then skips, naming it.

    - `bitwise_replay`: `Trainer.train_step` on the same batch gives bitwise-identical adapter and optimizer state
      (what lets a retried or replayed step reuse, and be checked against, the first attempt's artifacts).
    - `distinct_samples_within_group`: the `n` rollouts of one request are not `n` copies of one completion.
    - `distinct_groups_across_seeds`: two requests that differ only in their seed sample different groups.
    - `supports_pipelined`: the driver runs `GrpoConfig(pipelined=True)` (one-step-stale rollouts).
    - `trainer_kl_penalty`: the trainer's step adds the declared KL penalty to its loss and reports the KL as
      `metrics.kl` (a trainer without one, like our in-memory trainer, declares False and declares no KL reference).
    """

    bitwise_replay: bool = True
    distinct_samples_within_group: bool = True
    distinct_groups_across_seeds: bool = True
    supports_pipelined: bool = True
    trainer_kl_penalty: bool = True

    @classmethod
    def flags(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def require(capabilities: Capabilities, flag: str, law: str) -> None:
    """Skip the calling law unless `capabilities.<flag>` is True; the reason names the flag and the law."""
    if flag not in Capabilities.flags():
        raise ValueError(f"unknown capability {flag!r}; the flags are {', '.join(Capabilities.flags())}")
    if not isinstance(capabilities, Capabilities):
        raise TypeError(
            f"the `capabilities` fixture returned {type(capabilities).__name__}; return a "
            "rl.conformance.Capabilities (e.g. Capabilities(bitwise_replay=False))"
        )
    if not getattr(capabilities, flag):
        pytest.skip(
            f"Capabilities.{flag} is False (declared by the `capabilities` fixture), so this law does not apply: {law}"
        )
