"""Verifiable rewards for integer-answer problems (GSM8K style), and a registry of them by name.

The tutorial's scorer: +0.2 when the completion carries the `####` answer marker, +1.0 when the answer it extracts
equals the reference. Rewards are looked up by name (`get_reward`) so stored rollouts can be re-scored later under
another reward without re-generating them.

Pure Python: the reward tier runs on a CPU without torch.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from decimal import Decimal

from rl.errors import UnknownRewardError

__all__ = [
    "ANSWER_MARKER",
    "FORMAT_BONUS",
    "REWARDS",
    "RewardFn",
    "correctness_reward",
    "extract_answer",
    "format_reward",
    "get_reward",
    "score",
]

ANSWER_MARKER = "####"
FORMAT_BONUS = 0.2
CORRECT_BONUS = 1.0

RewardFn = Callable[[str, str], float]
"""`reward(completion, reference_answer) -> float`."""

# A number as written in a completion: an optional minus, digits with optional thousands separators ("1,234,567"; a
# comma not followed by exactly three digits ends the number, so "3,4" is 3 then 4), and an optional decimal part.
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")


def extract_answer(completion: str) -> str | None:
    """The answer a completion commits to, as a canonical number string, or None if it holds no number.

    The first number after the last `####` marker; when no marker is present, or none of the text after the last one
    is a number, the last number in the text. Canonical form: thousands separators dropped, no leading zeros, `-0` is
    `0`, an integral decimal (`42.00`) is the integer (`42`); a non-integral decimal keeps its fraction (`3.5`), so it
    never matches an integer answer by truncation.

    >>> extract_answer("9 * 2 = 18 dollars a day.\\n#### 1,200")
    '1200'
    >>> extract_answer("The answer is 42.")
    '42'
    """
    _, marker, tail = completion.rpartition(ANSWER_MARKER)
    if marker:
        after = _NUMBER.search(tail)
        if after is not None:
            return _canonical(after.group())
    numbers = _NUMBER.findall(completion)
    return _canonical(numbers[-1]) if numbers else None


def format_reward(completion: str) -> float:
    """0.2 when the completion carries the `####` answer marker, else 0.0: the tutorial's format bonus."""
    return FORMAT_BONUS if ANSWER_MARKER in completion else 0.0


def correctness_reward(completion: str, answer: str) -> float:
    """1.0 when the extracted answer equals the reference (both canonicalised, so `1,200` matches `1200`), else 0.0."""
    predicted = extract_answer(completion)
    return CORRECT_BONUS if predicted is not None and predicted == _canonical_reference(answer) else 0.0


def is_correct(completion: str, answer: str) -> bool:
    """Whether the completion's extracted answer equals the reference, both canonicalised (accuracy, pass@k)."""
    return correctness_reward(completion, answer) > 0.0


def score(completion: str, answer: str) -> float:
    """The tutorial's reward: `format_reward` + `correctness_reward`, so one of 0.0, 0.2, 1.0, 1.2."""
    return format_reward(completion) + correctness_reward(completion, answer)


REWARDS: dict[str, RewardFn] = {
    "default": score,
    "format": lambda completion, _answer: format_reward(completion),
    "correctness": correctness_reward,
}
"""Every reward by name. `"default"` is the tutorial's `score`; a re-scoring run names one of these."""


def get_reward(name: str) -> RewardFn:
    """The reward registered under `name` in `REWARDS`.

    Raises:
        UnknownRewardError: (a `KeyError`) no such reward; its message lists the known names.
    """
    try:
        return REWARDS[name]
    except KeyError:
        raise UnknownRewardError(name, sorted(REWARDS)) from None


@functools.lru_cache(maxsize=4096)
def _canonical(number: str) -> str:
    # Memoised: numbers are short and repeat (every answer of every group is canonicalised twice), Decimal is slow.
    value = Decimal(number.replace(",", ""))
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


@functools.lru_cache(maxsize=4096)
def _canonical_reference(answer: str) -> str:
    text = answer.strip()
    return _canonical(text) if _NUMBER.fullmatch(text) else text
