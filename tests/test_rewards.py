"""Answer extraction and the tutorial's verifiable reward, on realistic completions and under properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.rewards import REWARDS, extract_answer, format_reward, get_reward, score

# (completion, extracted answer) as a small model writes them: GSM8K-style reasoning, thousands separators, negatives,
# no marker, several markers, a marker with nothing after it, decimals.
COMPLETIONS = [
    ("Janet sells 16 - 3 - 4 = 9 eggs.\nShe makes 9 * 2 = $18 every day.\n#### 18", "18"),
    ("The house cost 80,000 + 50,000 = 130,000.\n#### 130,000", "130000"),
    ("Total: 1,234,567 grains.\n#### $1,234,567.", "1234567"),
    ("The temperature falls 15 degrees from 8, so it is 8 - 15 = -7.\n#### -7", "-7"),
    ("####-3", "-3"),
    ("She has 3 + 4 = 7 apples, then doubles them: 7 * 2 = 14. The answer is 14.", "14"),
    ("#### 10\nWait, I misread the question. 12 - 3 = 9.\n#### 9", "9"),
    ("First guess #### 5, final answer #### 6 apples", "6"),
    ("So the answer is 72 ####", "72"),
    ("The final answer is **#### 72** clips.", "72"),
    ("Each box holds 2,50 items", "50"),
    ("He typed 1,2345 instead of 12,345 by mistake.", "12345"),
    ("He typed 12,345 and then 1,2345", "2345"),
    ("The average is 7.5.\n#### 7.5", "7.5"),
    ("#### 42.00", "42"),
    ("#### 007", "7"),
    ("I am not sure how to solve this.", None),
    ("", None),
    ("####", None),
]


@pytest.mark.parametrize(("completion", "expected"), COMPLETIONS)
def test_extract_answer_reads_realistic_completions(completion, expected):
    """On each realistic completion, `extract_answer` returns the answer a grader would read, canonicalised."""
    assert extract_answer(completion) == expected


def _no_digits(max_size: int = 30) -> st.SearchStrategy[str]:
    # `\d` in Python's re matches every Unicode decimal digit (category Nd), not only 0-9.
    return st.text(st.characters(exclude_categories=("Nd", "Cs")), max_size=max_size)


@given(data=st.data())
def test_marked_integer_is_extracted_whatever_precedes_it(data):
    """`<any text>#### <n>` followed by digit-free text extracts `str(n)`, with or without thousands separators."""
    n = data.draw(st.integers(min_value=-(10**12), max_value=10**12))
    written = data.draw(st.sampled_from([f"{n}", f"{n:,}"]))
    prefix = data.draw(st.text(max_size=40))
    suffix = data.draw(_no_digits())
    assert extract_answer(f"{prefix}\n#### {written}{suffix}") == str(n)


@given(data=st.data())
def test_last_integer_is_extracted_when_there_is_no_marker(data):
    """Without a `####` marker, the last integer of the text is the answer."""
    words = data.draw(st.lists(_no_digits(10).filter(lambda s: "#" not in s), min_size=1, max_size=5))
    numbers = data.draw(st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=5))
    # Spaces keep neighbouring numbers apart; a '-' before a number would make it negative.
    text = " ".join(f"{w.replace('-', '')} {k}" for w, k in zip(words, numbers, strict=False))
    assert extract_answer(text) == str(numbers[min(len(words), len(numbers)) - 1])


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("9 * 2 = 18.\n#### 18", "18", 1.2),  # right, formatted
        ("9 * 2 = 18.", "18", 1.0),  # right, no marker
        ("9 * 2 = 17.\n#### 17", "18", 0.2),  # wrong, formatted
        ("I do not know.", "18", 0.0),  # wrong, unformatted
        ("#### 1200", "1,200", 1.2),  # the reference's separators do not matter
        ("#### 1,200", "1200", 1.2),  # nor the completion's
        ("4", "4", 1.0),  # the digit-successor task's bare answer (rl/problems.py)
        ("45", "4", 0.0),  # its last integer is 45, not 4
        ("#### 3.5", "3", 0.2),  # a decimal is not truncated into an integer match
    ],
)
def test_score_adds_format_bonus_and_correctness(completion, answer, reward):
    """`score` is 0.2 for the `####` marker plus 1.0 for a correct answer, as the tutorial scores."""
    assert score(completion, answer) == reward


@given(completion=st.text(max_size=60), answer=st.text(max_size=8))
def test_score_is_format_plus_correctness_and_takes_one_of_four_values(completion, answer):
    """For any text, `score` is one of 0.0, 0.2, 1.0, 1.2 and its 0.2 part is exactly the `format` reward."""
    reward = score(completion, answer)
    assert reward in (0.0, 0.2, 1.0, 1.2)
    assert (reward in (0.2, 1.2)) == (format_reward(completion) == 0.2) == ("####" in completion)


@given(n=st.integers(min_value=-(10**6), max_value=10**6), prefix=st.text(max_size=30))
def test_a_correct_marked_answer_scores_the_maximum(n, prefix):
    """A completion ending `#### <answer>` earns the full 1.2 whatever reasoning precedes it."""
    assert score(f"{prefix}\n#### {n}", str(n)) == 1.2


def test_registry_names_the_default_and_format_rewards():
    """`get_reward("default")` is the tutorial's score and `get_reward("format")` ignores correctness."""
    assert get_reward("default") is score
    assert get_reward("format")("#### 17", "18") == 0.2
    assert get_reward("format")("18", "18") == 0.0
    assert set(REWARDS) >= {"default", "format"}


def test_unknown_reward_name_raises_key_error_listing_known_names():
    """An unregistered name raises a KeyError whose message lists every registered reward."""
    with pytest.raises(KeyError) as info:
        get_reward("rubric-v2")
    message = str(info.value)
    assert "rubric-v2" in message
    assert all(name in message for name in REWARDS)


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [("#### 1,200", "1200", True), ("#### 1200", "1,200", True), ("answer 41", "42", False), ("no number", "4", False)],
)
def test_is_correct_compares_canonical_answers(completion, answer, expected):
    """Accuracy counts a completion right exactly when its canonical answer equals the canonical reference."""
    from rl.rewards import is_correct

    assert is_correct(completion, answer) is expected


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_the_scorer_returns_each_rollouts_reward_in_the_rollouts_order(name):
    """`RewardScorer.score_group`: reward i belongs to rollout i (a group's rewards sorted, reversed or deduplicated
    would no longer follow their rollouts, and the advantages would credit the wrong samples)."""
    import asyncio

    from rl.scoring import RewardScorer
    from rl.types import Rollout

    completions = ["#### 7", "no answer", "#### 3", "the answer is 7", "####7"]
    group = [Rollout(0, "6=", "7", c, [6], [1], [-0.5], 0, 1) for c in completions]
    rewards = asyncio.run(RewardScorer(name).score_group(group))
    assert rewards == [float(get_reward(name)(c, "7")) for c in completions]
    assert len(set(rewards)) > 1 and rewards != sorted(rewards)
