"""What every benchmark shares: a repeated figure as its median and spread, and the aligned `name  value` lines."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from rl.errors import InputError


def check_repeats(repeats: int) -> None:
    """Refuses a repeat count below one before any work is timed (`spread` of no values has no median)."""
    if repeats < 1:
        raise InputError(f"repeats must be >= 1, got {repeats}")


def spread(name: str, values: Sequence[float]) -> dict[str, float]:
    """`{name: median, name_min: ..., name_max: ...}` of one figure's repeats."""
    return {name: statistics.median(values), f"{name}_min": min(values), f"{name}_max": max(values)}


def figure_lines(figures: dict[str, Any]) -> list[str]:
    """One aligned `name  value` line per figure; a figure with `name_min` and `name_max` beside it (repeated
    measurements: the median under its name) prints as `name  median (min-max)`."""
    spreads = {k for k in figures if f"{k}_min" in figures and f"{k}_max" in figures}
    folded = {f"{k}_{end}" for k in spreads for end in ("min", "max")}
    shown = [k for k in figures if k not in folded]
    width = max(len(k) for k in shown)

    def show(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = []
    for key in shown:
        value = show(figures[key])
        if key in spreads:
            value += f" ({show(figures[f'{key}_min'])}-{show(figures[f'{key}_max'])})"
        lines.append(f"{key:<{width}}  {value}")
    return lines
