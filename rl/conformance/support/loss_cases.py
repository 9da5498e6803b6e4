"""What the loss laws call the loss on: a padded batch of completions (`LossBatch`), the strategies that draw one
(stale ratios, reference gaps, padding a law must not see), and the hazardous cells run before anything is drawn."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "AT_RATIO_ONE",
    "CLIP_CELLS",
    "KL_CELLS",
    "KL_LOG_RATIO",
    "LOG_RATIO",
    "LossBatch",
    "as_on_policy",
    "cell",
    "loss_batches",
    "repadded",
]


@dataclass(frozen=True)
class LossBatch:
    """A padded batch of completions: row i's first `lengths[i]` tokens are its completion, the rest padding."""

    new: tuple[tuple[float, ...], ...]
    old: tuple[tuple[float, ...], ...]
    ref: tuple[tuple[float, ...], ...]
    advantages: tuple[float, ...]
    lengths: tuple[int, ...]
    clip_eps: float = 0.2
    kl_beta: float = 0.0

    def __repr__(self) -> str:
        return f"LossBatch({self})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    @property
    def width(self) -> int:
        return len(self.new[0])

    def tokens(self) -> list[tuple[int, int]]:
        """Every unmasked (row, token) position."""
        return [(i, t) for i, length in enumerate(self.lengths) for t in range(length)]

    def __str__(self) -> str:
        return (
            f"lengths={list(self.lengths)} of width {self.width}, advantages={list(self.advantages)}, "
            f"clip_eps={self.clip_eps!r}, kl_beta={self.kl_beta!r}, new_logp={_rows(self.new)}, "
            f"old_logp={_rows(self.old)}, ref_logp={_rows(self.ref)}"
        )


def _rows(rows: Sequence[Sequence[float]]) -> list[list[float]]:
    return [list(row) for row in rows]


def cell(
    rows: Sequence[tuple[float, Sequence[tuple[float, float, float]]]],
    *,
    clip_eps: float = 0.2,
    kl_beta: float = 0.0,
    padding: int = 1,
) -> LossBatch:
    """A batch from `(advantage, [(old, log ratio, ref - new), ...])` rows, right-padded to the longest plus
    `padding` with tokens of their own (new -2.5, old and ref -0.5: a ratio of e^-2 and a 2-nat gap), which no law may
    see."""
    width = max(len(tokens) for _, tokens in rows) + padding
    new, old, ref = [], [], []
    for _, tokens in rows:
        pad = width - len(tokens)
        old.append(tuple([o for o, _, _ in tokens] + [-0.5] * pad))
        new.append(tuple([o + lr for o, lr, _ in tokens] + [-2.5] * pad))
        ref.append(tuple([o + lr + gap for o, lr, gap in tokens] + [-0.5] * pad))
    return LossBatch(
        tuple(new),
        tuple(old),
        tuple(ref),
        tuple(a for a, _ in rows),
        tuple(len(tokens) for _, tokens in rows),
        clip_eps,
        kl_beta,
    )


def repadded(rows: Sequence[Sequence[float]], lengths: Sequence[int], value: float) -> tuple[tuple[float, ...], ...]:
    """`rows` with every padding position (past its row's length) set to `value`."""
    return tuple(tuple(v if t < n else value for t, v in enumerate(row)) for row, n in zip(rows, lengths, strict=True))


def as_on_policy(case: LossBatch) -> LossBatch:
    return replace(case, old=case.new)


_ZERO = st.just(0.0)
_CLIP_EPS = st.just(0.2)
_ADVANTAGE = st.one_of(st.just(0.0), st.floats(min_value=-10.0, max_value=10.0))
_GAP = st.floats(min_value=-8.0, max_value=8.0)
LOG_RATIO = st.one_of(
    st.floats(min_value=-8.0, max_value=8.0),  # stale by several nats
    st.floats(min_value=-0.5, max_value=0.5),  # around the trust region
)


@st.composite
def _token(draw: st.DrawFn, log_ratio: st.SearchStrategy[float], gap: st.SearchStrategy[float]) -> tuple[float, ...]:
    """`(new, old, ref)` log-probs in [-30, 0] with `new - old` and `ref - new` drawn from `log_ratio` and `gap`."""
    lr, g = draw(log_ratio, label="new - old"), draw(gap, label="ref - new")
    low, high = max(-20.0, lr - 30.0, -30.0 - g), min(-0.01, lr - 0.01, -g - 0.01)
    new = draw(st.floats(min_value=low, max_value=high), label="new")
    return new, new - lr, new + g


@st.composite
def loss_batches(
    draw: st.DrawFn,
    *,
    log_ratio: st.SearchStrategy[float] = _ZERO,
    gap: st.SearchStrategy[float] = _GAP,
    advantage: st.SearchStrategy[float] = _ADVANTAGE,
    kl_beta: st.SearchStrategy[float] = _ZERO,
    clip_eps: st.SearchStrategy[float] = _CLIP_EPS,
    max_rows: int = 4,
    max_length: int = 16,
) -> LossBatch:
    """One to `max_rows` completions of 1 to `max_length` tokens, right-padded by up to 2 tokens drawn like the rest
    (a law that sees them fails), with the log-ratio and reference gap of every token drawn from the strategies."""
    lengths = draw(st.lists(st.integers(1, max_length), min_size=1, max_size=max_rows), label="lengths")
    width = max(lengths) + draw(st.integers(0, 2), label="padding")
    token = _token(log_ratio, gap)
    rows = [draw(st.lists(token, min_size=width, max_size=width), label=f"row {i}") for i in range(len(lengths))]
    return LossBatch(
        new=tuple(tuple(t[0] for t in row) for row in rows),
        old=tuple(tuple(t[1] for t in row) for row in rows),
        ref=tuple(tuple(t[2] for t in row) for row in rows),
        advantages=tuple(draw(advantage, label=f"advantage {i}") for i in range(len(lengths))),
        lengths=tuple(lengths),
        clip_eps=draw(clip_eps, label="clip_eps"),
        kl_beta=draw(kl_beta, label="kl_beta"),
    )


# -- explicit cells ----------------------------------------------------------------------------------------------------

_LN = math.log
AT_RATIO_ONE = (
    cell([(1.0, [(-1.0, 0.0, 0.0)])]),
    cell([(-0.5, [(-0.3, 0.0, 0.7)] * 7)]),
    cell([(1.5, [(-1.0, 0.0, 5.0)]), (-2.0, [(-4.0, 0.0, -5.0)] * 7), (0.0, [(-0.2, 0.0, 1.0)] * 64)], padding=3),
    cell([(3.0, [(-2.0, 0.0, 8.0)] * 5), (-3.0, [(-9.0, 0.0, -8.0)] * 5)]),
    cell([(0.25, [(-12.0, 0.0, 0.05), (-0.01, 0.0, -0.05), (-7.0, 0.0, 2.0)])], padding=0),
)
"""Ratio exactly 1: one token; seven; lengths 1, 7 and 64 with three tokens of padding and gaps of 5 nats; +-8 nats."""


def _clip_row(advantage: float, old: float, eps: float) -> tuple[float, list[tuple[float, float, float]]]:
    ratios = [-8.0, -5.0, _LN(0.5), _LN(1 - eps), _LN(0.9), 0.0, _LN(1.1), _LN(1 + eps), _LN(1.5), 5.0, 8.0]
    return advantage, [(old - max(lr, 0.0), lr, 0.0) for lr in ratios]


CLIP_CELLS = tuple(
    cell([_clip_row(a, old, eps), _clip_row(-a * 0.5, old, eps)], clip_eps=eps)
    for eps, a, old in ((0.2, 1.3, -0.5), (0.1, 3.0, -3.0), (0.28, 0.4, -12.0))
)
"""Ratios e^-8, e^-5, 0.5, 1 - eps, 0.9, 1, 1.1, 1 + eps, 1.5, e^5 and e^8 for a positive and a negative advantage,
at clip_eps 0.2, 0.1 and 0.28 (DAPO's clip-higher bound)."""

KL_CELLS = (
    cell([(0.0, [(-1.0, 0.0, gap) for gap in (0.05, -0.05, 1.0, -1.0, 5.0, -5.0, 8.0, -8.0)])], kl_beta=0.04),
    cell([(0.0, [(-3.0, 0.0, 0.5)] * 3), (2.0, [(-0.5, 0.0, -2.0)]), (-1.0, [(-6.0, 0.0, 6.0)] * 9)], kl_beta=0.5),
    cell(
        [
            (0.0, [(-4.0, lr, gap) for lr, gap in ((0.7, 1.0), (-0.7, -1.0), (1.5, 2.0), (-1.5, 0.5))]),
            (1.0, [(-3.0, 0.1, 1.0), (-1.5, -0.1, -1.0)]),
        ],
        kl_beta=0.3,
    ),
)
"""Reference gaps of +-0.05, 1, 5 and 8 nats; advantages of 0 and not; ratios of e^+-0.7 and e^+-1.5, where a KL term
that should be weighted by the ratio and is not (or is and should not) differs from the declared one (on-policy
declarations see them at ratio 1)."""

KL_LOG_RATIO = st.one_of(st.just(0.0), st.floats(min_value=-2.0, max_value=2.0))
"""The KL laws' log ratios: 1, and away from it (e^-2 to e^2)."""
