"""Held-out evaluation metrics (pass@k and avg@k), and the mean the iteration rows use.

Pure Python: the evaluator's reducer and the report compute these without torch.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

__all__ = ["avg_at_k", "finite_mean", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from `n` samples of which `c` are correct: `1 - C(n-c, k) / C(n, k)`.

    The probability that at least one of `k` samples drawn without replacement from the `n` is correct (Chen et al.,
    "Evaluating Large Language Models Trained on Code", 2021), computed as the paper does, without binomials:

        1 - prod_{i = n-c+1}^{n} (1 - k / i)

    The factors are multiplied from `i = n` downwards, so one more correct sample multiplies the product by one more
    factor <= 1 last, and the estimate can never decrease in `c` through rounding (nor in `k`: every factor shrinks).

    Raises:
        ValueError: unless `0 <= c <= n` and `1 <= k <= n` (all integers).
    """
    n, c, k = _integer("n", n), _integer("c", c), _integer("k", k)
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    none_correct = 1.0
    for i in range(n, n - c, -1):
        none_correct *= 1.0 - k / i
    return 1.0 - none_correct


def avg_at_k(correct_counts: Sequence[int], k: int) -> float:
    """avg@k: the mean over problems of the fraction of a problem's `k` samples that are correct.

    `correct_counts[p]` is how many of problem `p`'s `k` samples are correct. avg@k estimates the per-sample accuracy
    (it equals the mean of `pass_at_k(k, c, 1)`); pass@k, from the same counts, asks whether any sample was right.

    Raises:
        ValueError: no problems, `k < 1`, or a count outside `0..k` (the message names its index).
    """
    k = _integer("k", k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if len(correct_counts) == 0:
        raise ValueError("avg@k of no problems is undefined")
    counts = [_integer(f"correct_counts[{p}]", c) for p, c in enumerate(correct_counts)]
    for p, c in enumerate(counts):
        if not 0 <= c <= k:
            raise ValueError(f"correct_counts[{p}] must be in 0..{k}, got {c}")
    return sum(counts) / (k * len(counts))


def two_proportion_p(a: int, n: int, b: int, m: int) -> float:
    """Two-sided p-value that a/n and b/m differ (pooled two-proportion z-test; the normal approximation wants about
    5 successes and 5 failures on each side). 1.0 when nothing varies (every sample right, or none).

    Raises:
        ValueError: a count outside 0..n (or 0..m), or an empty side.
    """
    for label, hits, total in (("a", a, n), ("b", b, m)):
        hits, total = _integer(label, hits), _integer(f"its total ({label})", total)
        if total < 1 or not 0 <= hits <= total:
            raise ValueError(f"{label} must be a count in 0..total with total >= 1, got {hits} of {total}")
    pooled = (a + b) / (n + m)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / m))
    if se == 0:
        return 1.0
    return math.erfc(abs(b / m - a / n) / se / math.sqrt(2))


def finite_mean(values: Sequence[float]) -> float:
    """The mean of finite numbers, finite itself and within [min, max] however large they are; 0.0 for none.

    `sum(values) / n` overflows to infinity for two rewards of 1e308, and `math.fsum` raises. The correctly rounded
    `fsum(values) / n` is kept whenever the sum fits a float; otherwise the values are first scaled by a power of two
    at least n (exact: values that large have no subnormal bits to lose), so no partial sum can pass the largest one.
    The result is clamped to [min, max], where the true mean lies: rounding the sum and then the quotient can
    otherwise step one ulp outside (the mean of three equal values can exceed them).
    """
    n = len(values)
    if n == 0:
        return 0.0
    try:
        mean = math.fsum(values) / n
    except OverflowError:
        mean = math.inf
    if not math.isfinite(mean):
        scale = 2.0 ** math.ceil(math.log2(n))
        mean = math.fsum(v / scale for v in values) / n * scale
    return min(max(mean, min(values)), max(values))


def _integer(label: str, value: object) -> int:
    # operator.index admits numpy integers and rejects floats; a bool is almost always a count that was never summed.
    if isinstance(value, bool):
        raise ValueError(f"{label} must be an integer, got the bool {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]  # non-indexables raise TypeError, handled below
    except TypeError:
        raise ValueError(f"{label} must be an integer, got {value!r}") from None
