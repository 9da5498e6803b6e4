"""The pure domain modules stay importable on a CPU-only reward or driver host: no torch, flyte or vllm behind them."""

from __future__ import annotations

import json
import subprocess
import sys

PURE_MODULES = ("rl.algorithm.advantages", "rl.rewards", "rl.metrics", "rl.seeding")
HEAVY_PACKAGES = ("torch", "flyte", "vllm")


def test_pure_domain_modules_import_no_torch_flyte_or_vllm():
    """Importing the pure modules in a fresh interpreter leaves torch, flyte and vllm out of `sys.modules`."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {PURE_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY_PACKAGES!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == []
