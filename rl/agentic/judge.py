"""Scoring of the agentic tutorial: a deterministic verifier (Harbor's test.sh) plus the LLM judge's rubric formula.

`judge_score` is the stand-in for the vendor judge's answer, a pure function of (trajectory, rubric): in production
the call to the vendor is what `@flyte.trace` memoises; here the formula plays the vendor, with seeded noise.
"""

from __future__ import annotations

import random

from rl.agentic.world import ANSWER_FILE, N_DOCS, secret_digest
from rl.seeding import derive_seed
from rl.types import Reward, Rubric, Trajectory

JUDGE_NOISE = 0.05
"""Half-width of the judge's uniform noise: two judges never agree to the third decimal."""


def verify(traj: Trajectory) -> bool:
    """The deterministic verifier: did the trial answer the digest of its world's secret?"""
    return traj.answer == secret_digest(traj.seed, traj.world_id)


def judge_score(traj: Trajectory, rubric: Rubric) -> float:
    """The tutorial's rubric formula, rounded to 3 decimals.

    score = w_c·correct + w_e·efficiency + w_t·tidy + U(-0.05, 0.05), with efficiency = max(0, 1 - (turns - 1)/N_DOCS)
    and tidy = 1 when the trial wrote only `answer.txt`; the noise is seeded by (run seed, trial id, rubric name).
    """
    rng = random.Random(derive_seed("judge", traj.seed, traj.trial_id, rubric.name))
    correct = 1.0 if verify(traj) else 0.0
    efficiency = max(0.0, 1.0 - (len(traj.turns) - 1) / N_DOCS)
    tidy = 1.0 if traj.files_written == [ANSWER_FILE] else 0.0
    score = (
        rubric.correctness_weight * correct + rubric.efficiency_weight * efficiency + rubric.tidiness_weight * tidy
    ) + rng.uniform(-JUDGE_NOISE, JUDGE_NOISE)
    return round(score, 3)


def make_reward(traj: Trajectory, verified: bool, score: float) -> Reward:
    """reward = 1[verified] + judge score; `found_doc` is the document where the secret turned up, if it did."""
    found_doc = next((t.doc for t in traj.turns if t.found), None)
    return Reward(
        trial_id=traj.trial_id,
        world_id=traj.world_id,
        verified_correct=verified,
        n_turns=len(traj.turns),
        judge_score=score,
        reward=round((1.0 if verified else 0.0) + score, 3),
        found_doc=found_doc,
    )
