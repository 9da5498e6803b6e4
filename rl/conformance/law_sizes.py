"""How much the sampling laws draw, declared once by an implementation whose forward pass is dear.

Three engine laws are statistical and draw many seeded groups: the frequency law (64 groups of 64 first tokens), the
end-of-sequence law (8 groups of 16, up to 32 tokens) and the adjacent-seeds law (3 pairs of groups of 16). On the
tiny model they take seconds; on a real model each group re-reads the whole chat-templated prompt per sample, and the
frequency law alone takes minutes. A declared `draw_fraction` draws that fraction of each law's groups (at least
one). Each law's test stays exact at the size it runs (its false-alarm chance does not change); what shrinks is its
power, the size of a bug it can see, so a record made at a fraction below 1 says so (the plugin's header line).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["LawSizes"]


@dataclass(frozen=True)
class LawSizes:
    """The share of their seeded groups the sampling laws draw.

    - `draw_fraction`: in (0, 1]; each sampling law draws `ceil(groups * draw_fraction)` of its groups. 1.0, the
      default, is the full size; `rl.conformance.bindings.ours:REAL_LM` declares 1/8 (docs/conformance.md says what it
      costs).
    """

    draw_fraction: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.draw_fraction, bool) or not isinstance(self.draw_fraction, (int, float)):
            raise TypeError(f"LawSizes.draw_fraction must be a number, got {type(self.draw_fraction).__name__}")
        if not 0.0 < self.draw_fraction <= 1.0:
            raise ValueError(f"LawSizes.draw_fraction must be in (0, 1], got {self.draw_fraction!r}")

    def groups(self, full: int) -> int:
        """How many of a law's `full` groups to draw: `ceil(full * draw_fraction)`, at least 1."""
        return max(1, math.ceil(full * self.draw_fraction - 1e-9))  # 1e-9: 25 * 0.28 is 7.000000000000001, 7 groups

    def declared(self) -> str:
        """The declaration as a header line shows it; empty at the full size."""
        return "" if self.draw_fraction == 1.0 else f"draw_fraction={self.draw_fraction:g}"
