"""Scoring utilities a fork rewrites, each with a bug real evaluation code ships; the suite must fail each."""

from __future__ import annotations

import re

from rl.conformance import Implementation
from rl.deploy.simulated.grpo_tiers import MemoryScorer
from rl.metrics import pass_at_k
from rl.rewards import extract_answer


def biased_pass_at_k(n: int, c: int, k: int) -> float:
    """`1 - (1 - c/n)^k`: pass@k as if the k samples were drawn with replacement (biased low for k > 1)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"bad counts n={n}, c={c}, k={k}")
    return 1.0 - (1.0 - c / n) ** k


def unseparated_extract_answer(completion: str) -> str | None:
    """The first number after the last `####`, read without thousands separators: "1,200" extracts "1"."""
    _, marker, tail = completion.rpartition("####")
    numbers = re.findall(r"-?\d+(?:\.\d+)?", tail if marker else completion)
    return numbers[0] if marker and numbers else (numbers[-1] if numbers else None)


BIASED_PASS_AT_K = Implementation(
    name="biased-pass-at-k", scorer=MemoryScorer, extract_answer=extract_answer, pass_at_k=biased_pass_at_k
)
UNSEPARATED_EXTRACTION = Implementation(
    name="unseparated-extraction", scorer=MemoryScorer, extract_answer=unseparated_extract_answer, pass_at_k=pass_at_k
)
