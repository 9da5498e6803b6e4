"""Verifiable problem sets: the digit successor for the CPU stack, seeded arithmetic for real models, and the registry
a run's `problems` name selects from. Pure Python: importable without torch.

Scoring (the contract between this module, the samplers and `rl.rewards.score`): a rollout is scored on its
*completion only* — the text the policy generated after the prompt, decoded with special tokens (`<eos>`) skipped —
as `rl.rewards.score(rollout.completion, prompt.answer)`. The prompt is never included: `extract_answer` falls back
to the last number in the text, so scoring prompt + completion would score a completion without a number on the
prompt's own number (for word problems that number is sometimes the answer). So on "3=": "4" earns 1.0, "#### 4"
earns 1.2 (the format bonus), "45" earns 0.0 (the last number is 45) and "" earns 0.0.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rl.errors import InputError
from rl.rewards import ANSWER_MARKER, is_correct
from rl.types import Prompt, Rollout


@dataclass(frozen=True)
class DigitSuccessor:
    """Prompt `"d="` for d in 0..9, answer `str((d + 1) % 10)`: the right answer depends on the prompt.

    Any single constant answer is right on exactly one prompt in ten (`constant_baseline_accuracy` = 0.1), so accuracy
    clearly above 0.1 means the policy learned to read its prompt. The task space is only ten problems, so the held-out
    set cannot hold unseen problems: `eval_prompts` are the same ten, and held-out evaluation means fresh samples
    (evaluation seeds disjoint from training seeds), not fresh problems.
    """

    def train_prompts(self) -> Sequence[Prompt]:
        return [Prompt(question=f"{d}=", answer=str((d + 1) % 10)) for d in range(10)]

    def eval_prompts(self) -> Sequence[Prompt]:
        return self.train_prompts()

    def metrics(self, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> dict[str, float]:
        """Accuracy only: the answer is a bare digit, so there is no answer format to measure."""
        return {"accuracy": accuracy(rollouts)}


def accuracy(rollouts: Sequence[Rollout]) -> float:
    """The share of rollouts whose extracted answer equals their reference (`rl.rewards.is_correct`)."""
    return sum(is_correct(r.completion, r.answer) for r in rollouts) / len(rollouts)


def format_rate(rollouts: Sequence[Rollout]) -> float:
    """The share of rollouts that mark their answer with `####`, for tasks whose prompt asks for that marker."""
    return sum(ANSWER_MARKER in r.completion for r in rollouts) / len(rollouts)


def marked_answer_metrics(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> dict[str, float]:
    """The metrics of a task whose prompt asks for the answer after `####`: accuracy and format rate."""
    return {"accuracy": accuracy(rollouts), "format_rate": format_rate(rollouts)}


def constant_baseline_accuracy(prompts: Sequence[Prompt]) -> float:
    """The accuracy of the best policy that ignores its prompt: the share of the most common reference answer.

    Raises ValueError on an empty sequence (a baseline over no problems is undefined).
    """
    if not prompts:
        raise ValueError("constant_baseline_accuracy needs at least one prompt; got an empty sequence")
    most_common = Counter(p.answer for p in prompts).most_common(1)[0][1]
    return most_common / len(prompts)


@dataclass(frozen=True)
class ArithmeticProblems:
    """Seeded two-operand arithmetic for a real language model: `count` training and `held_out` evaluation problems.

    The prompt asks for the answer after `####`, the marker the tutorial's reward gives its format bonus for.
    """

    count: int = 256
    held_out: int = 32
    seed: int = 0

    def _problems(self, n: int, offset: int) -> list[Prompt]:
        rng = random.Random(self.seed * 1_000_003 + offset)
        out: list[Prompt] = []
        for _ in range(n):
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            op = rng.choice("+-*")
            value = a + b if op == "+" else a - b if op == "-" else a * b
            out.append(
                Prompt(question=f"Compute {a} {op} {b}. End with the line '#### <answer>'.\n", answer=str(value))
            )
        return out

    def train_prompts(self) -> Sequence[Prompt]:
        return self._problems(self.count, 0)

    def eval_prompts(self) -> Sequence[Prompt]:
        return self._problems(self.held_out, 1)

    def metrics(self, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> dict[str, float]:
        return marked_answer_metrics(rollouts, rewards)


@dataclass(frozen=True)
class Addition:
    """ "What is a + b? Answer with the number only." for one-digit a and b: the real-model demo's task.

    The 100 pairs are shuffled by `seed`; the first `held_out` are the evaluation problems, never trained on, the rest
    the training problems. SmolLM2-135M-Instruct, prompted with its chat template and sampled at temperature 1, gets
    these right a minority of the time (docs/benchmarks.md has the measured base accuracy): room to learn, and a
    reward (`rl.rewards.score`, the last number of the answer) that verifies them.
    """

    held_out: int = 36
    seed: int = 0

    def _prompts(self) -> list[Prompt]:
        pairs = [(a, b) for a in range(10) for b in range(10)]
        random.Random(self.seed).shuffle(pairs)
        return [
            Prompt(question=f"What is {a} + {b}? Answer with the number only.", answer=str(a + b)) for a, b in pairs
        ]

    def train_prompts(self) -> Sequence[Prompt]:
        return self._prompts()[self.held_out :]

    def eval_prompts(self) -> Sequence[Prompt]:
        return self._prompts()[: self.held_out]

    def metrics(self, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> dict[str, float]:
        return {"accuracy": accuracy(rollouts)}


ProblemSet = DigitSuccessor | ArithmeticProblems | Addition  # a PromptSource with the task's own `metrics`
PROBLEM_SETS: dict[str, Callable[[], ProblemSet]] = {
    "digits": DigitSuccessor,
    "arithmetic": ArithmeticProblems,
    "addition": Addition,
}


def problem_set(name: str) -> ProblemSet:
    """The named problem set (`digits`: the tiny model's digit successor; `arithmetic`, `addition`: for real models)."""
    try:
        return PROBLEM_SETS[name]()
    except KeyError:
        raise InputError(f"unknown problem set {name!r}; choose one of {sorted(PROBLEM_SETS)}") from None
