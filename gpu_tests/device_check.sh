#!/usr/bin/env bash
# The torch-only subset of the GPU tests, for GPU runners that have torch, transformers, peft and pytest preinstalled
# but no vllm and no internet: the CUDA LoRA trainer tests, and the NCCL train step under torchrun (2 ranks on 2 GPUs;
# on one GPU the 2-rank test skips, with the count found, and a one-rank NCCL world runs instead). Installs nothing: the package runs from this checkout
# through PYTHONPATH, so the runner's own torch is the one tested. Finishes in under 8 minutes (a 60 s preflight and a
# 400 s budget for pytest, each under `timeout`) and ends with a table: test, result, seconds, key numbers.
#
#   gpu_tests/device_check.sh                      # exit status: pytest's (0 = all selected tests passed or skipped)
#   PYTHON=/opt/venv/bin/python gpu_tests/device_check.sh
#   RL_DEVICE_CHECK_OUT=/some/dir gpu_tests/device_check.sh   # also keep junit.xml, numbers.jsonl and pytest.log
#
# A machine without CUDA fails the preflight with the reason (exit 2); RL_GPU_STRICT=1 makes the tests fail rather
# than skip if CUDA disappears between the two.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
PY="${PYTHON:-python3}"
PREFLIGHT_S=60
PYTEST_BUDGET_S="${RL_DEVICE_CHECK_BUDGET_S:-400}"

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PIP_NO_INDEX=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export RL_GPU_STRICT=1
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

work="$(mktemp -d "${TMPDIR:-/tmp}/rl-device-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export RL_GPU_REPORT="$work/numbers.jsonl"
: >"$RL_GPU_REPORT"

echo "== device_check: preflight"
timeout --kill-after=10 "$PREFLIGHT_S" "$PY" - <<'PREFLIGHT'
import sys

import torch
import transformers
import peft

print(
    f"python {sys.version.split()[0]}; torch {torch.__version__} (CUDA {torch.version.cuda}); "
    f"transformers {transformers.__version__}; peft {peft.__version__}"
)
from rl.gpu import cuda_unavailable_reason, vllm_unavailable_reason

reason = cuda_unavailable_reason(1)
if reason is not None:
    print(f"device_check: {reason}", file=sys.stderr)
    sys.exit(2)
print("GPUs:", "; ".join(
    f"{i}: {torch.cuda.get_device_name(i)} ({torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB)"
    for i in range(torch.cuda.device_count())
))
print("vllm:", vllm_unavailable_reason() or "installed (its tests are not part of this check; run nox -s gpu)")
try:
    import pytest
except ImportError:
    print("device_check: pytest is not installed; this check runs the tests with pytest", file=sys.stderr)
    sys.exit(2)
PREFLIGHT

timeout_arg=()
if "$PY" -c "import pytest_timeout" 2>/dev/null; then
  timeout_arg=(--timeout=300)  # one hung test (a stuck collective) fails alone instead of eating the budget
fi

echo "== device_check: pytest gpu_tests -m 'gpu and not vllm' (budget ${PYTEST_BUDGET_S} s)"
set +e
timeout --kill-after=15 "$PYTEST_BUDGET_S" "$PY" -m pytest gpu_tests -m "gpu and not vllm" \
  -p no:cacheprovider -q -rA --junitxml="$work/junit.xml" ${timeout_arg[@]+"${timeout_arg[@]}"} 2>&1 | tee "$work/pytest.log"
status=${PIPESTATUS[0]}
set -e
if [[ $status -eq 124 || $status -eq 137 ]]; then
  echo "device_check: pytest did not finish within ${PYTEST_BUDGET_S} s" >&2
fi

if [[ -n "${RL_DEVICE_CHECK_OUT:-}" ]]; then
  mkdir -p "$RL_DEVICE_CHECK_OUT"
  cp -f "$work/pytest.log" "$work/numbers.jsonl" "$RL_DEVICE_CHECK_OUT"/
  [[ -f "$work/junit.xml" ]] && cp -f "$work/junit.xml" "$RL_DEVICE_CHECK_OUT"/
fi

echo
echo "== device_check: results"
"$PY" - "$work/junit.xml" "$RL_GPU_REPORT" "$status" <<'TABLE'
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

junit, numbers, status = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
found = {}
for line in numbers.read_text().splitlines():
    if line.strip():
        row = json.loads(line)
        found.setdefault(row.pop("test"), {}).update(row)
rows = []
if junit.is_file():
    for case in ET.parse(junit).getroot().iter("testcase"):
        name, seconds, result, detail = case.get("name", "?"), float(case.get("time", 0)), "passed", ""
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                result = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
                detail = (child.get("message") or "").splitlines()[0] if child.get("message") else ""
                break
        text = ", ".join(f"{k}={v}" for k, v in found.pop(name, {}).items())
        if result != "passed":
            text = f"{detail}; {text}" if text else detail
        rows.append((name, result, f"{seconds:.1f}", text))
for name, extra in found.items():  # recorded numbers of a test that never reached the report (killed)
    rows.append((name, "unfinished", "-", ", ".join(f"{k}={v}" for k, v in extra.items())))
if not rows:
    rows.append(("(no test results)", f"pytest exit {status}", "-", "see the log above"))
widths = [max(len(r[i]) for r in [("test", "result", "s", "key numbers"), *rows]) for i in range(3)]
print(f"{'test':<{widths[0]}}  {'result':<{widths[1]}}  {'s':>{widths[2]}}  key numbers")
for name, result, seconds, text in rows:
    print(f"{name:<{widths[0]}}  {result:<{widths[1]}}  {seconds:>{widths[2]}}  {text}")
print(f"pytest exit status: {status}")
TABLE

exit "$status"
