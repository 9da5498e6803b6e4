"""One trial of the agentic tutorial: the policy-driven agent loop against a private copy of a world.

Idempotent by construction: every draw comes from one PRNG seeded by (run seed, trial id), so a retried trial
regenerates exactly the trajectory its first attempt would have. The stream's first draw is the tutorial's
sandbox-failure coin (`sandbox_coin`, read by `rl.agentic.faults.FlakyTrials`): the trial skips it on every attempt, so
every later draw is the tutorial's whether or not a fault is injected.
The one field read off a clock, `elapsed_s`, uses the running event loop's: on a virtual-time loop (the simulator's) it
is exactly the tool calls' latency, so it regenerates too; on a real loop it also counts however long the machine took.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from rl.agentic.world import ANSWER_FILE, N_DOCS, SCRATCH_FILE, SECRET_MARKER, doc_path
from rl.protocols import Workspace
from rl.seeding import derive_seed
from rl.types import Trajectory, TrialSpec, Turn, Weights

UNTIDY_P = 0.3
"""Probability that an agent leaves `scratch.tmp` behind (the judge's tidiness term cares)."""


def trial_rng(spec: TrialSpec) -> random.Random:
    """The trial's one PRNG: the same stream on every attempt, process and machine."""
    return random.Random(derive_seed("trial", spec.seed, spec.trial_id))


def sandbox_coin(spec: TrialSpec) -> float:
    """The trial's sandbox-failure coin, its PRNG's first draw (the agentic tutorial fails attempt 0 when it is under
    the rate)."""
    return trial_rng(spec).random()


def doc_order(prior: Sequence[float], rng: random.Random) -> list[int]:
    """A reading order over every document: weighted sampling without replacement, weights from the bandit prior."""
    if len(prior) == 0 or any(not w > 0 for w in prior):
        raise ValueError(f"a document prior needs positive weights, one per document; got {list(prior)}")
    order: list[int] = []
    remaining = list(range(len(prior)))
    while remaining:
        pick = rng.choices(remaining, weights=[prior[i] for i in remaining], k=1)[0]
        order.append(pick)
        remaining.remove(pick)
    return order


async def run_trial(
    spec: TrialSpec,
    weights: Weights,
    workspace: Workspace,
    *,
    tool_latency_s: float = 0.2,
) -> Trajectory:
    """Read documents in the policy's order until the secret turns up (at most `spec.max_turns`), write the answer.

    Each turn is one tool call costing `tool_latency_s`; `elapsed_s` is measured on the running loop's clock.
    """
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    rng = trial_rng(spec)
    rng.random()  # the sandbox-failure coin (`sandbox_coin`): skipped, so the draws below are the tutorial's

    prior = weights.doc_prior.get(spec.world_id) or [1.0] * N_DOCS
    turns: list[Turn] = []
    answer: str | None = None
    for doc in doc_order(prior, rng)[: spec.max_turns]:
        text = workspace.read_text(doc_path(doc))
        found = SECRET_MARKER in text
        turns.append(Turn(doc=doc, found=found))
        await asyncio.sleep(tool_latency_s)
        if found:
            answer = text.split(SECRET_MARKER, 1)[1].strip()
            break

    written = [ANSWER_FILE]
    workspace.write_text(ANSWER_FILE, answer or "")
    if rng.random() < UNTIDY_P:
        workspace.write_text(SCRATCH_FILE, "notes")
        written.append(SCRATCH_FILE)

    return Trajectory(
        trial_id=spec.trial_id,
        world_id=spec.world_id,
        weights_version=weights.version,
        turns=turns,
        answer=answer,
        files_written=written,
        elapsed_s=round(loop.time() - t0, 2),
        fork_name=workspace.name,
        seed=spec.seed,
    )
