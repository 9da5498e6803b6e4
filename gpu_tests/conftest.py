"""GPU tests: every test here carries the `gpu` marker and skips with a precise reason when its hardware is missing."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
