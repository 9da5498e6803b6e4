"""Synthetic report rows for the report's tests: every field set, and a sample that names its iteration."""

from __future__ import annotations

from rl.types import EvalResult, IterationMetrics

DIGIT_TASK = ("accuracy",)
MARKED_TASK = ("accuracy", "format_rate")


def rows(
    n: int, *, task: tuple[str, ...] = DIGIT_TASK, completion: str = "", phases: bool = True
) -> list[IterationMetrics]:
    """`n` rows whose values change with the iteration; sample `i` reads `q<i>=` / `c<i>` (or `completion`)."""
    out = []
    for i in range(n):
        rate = min(1.0, 0.05 + 0.01 * i)
        out.append(
            IterationMetrics(
                iteration=i,
                policy_version=i + 1,
                num_rollouts=64,
                mean_reward=rate,
                max_reward=1.0,
                mean_loss=0.01 * (i % 5) - 0.02,
                contributing=48,
                sample_question=f"q{i}=",
                sample_completion=completion or f"c{i}",
                sample_reward=float(i % 2),
                no_signal_groups=i % 3,
                num_groups=8,
                kl=0.001 * i,
                clip_frac=0.01 * (i % 4),
                grad_norm=1.0 + 0.1 * i,
                mean_completion_tokens=2.0 + 0.01 * i,
                max_completion_tokens=3,
                task_metrics={name: rate for name in task},
                phase_s={"generate": 0.5, "score": 0.01, "train": 0.3, **({"evaluate": 0.2} if i % 5 == 0 else {})}
                if phases
                else {},
            )
        )
    return out


def evals(n: int, every: int = 5) -> list[EvalResult]:
    """Held-out results for the adapters of every `every`-th iteration of an `n`-row run."""
    return [
        EvalResult(policy_version=v, k=8, avg_at_k=0.01 * v, pass_at_k=0.02 * v, problems=10)
        for v in range(every, n + 1, every)
    ]
