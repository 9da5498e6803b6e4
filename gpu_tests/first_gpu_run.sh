#!/usr/bin/env bash
# The first run on a GPU machine, in one shot: on a machine with an NVIDIA GPU and nothing of ours installed, install
# uv.lock (uv sync --locked: vllm, torch for CUDA 13, ...), run the whole GPU tier strictly (RL_GPU_STRICT=1), measure
# vLLM against Hugging Face generate, and print a short report: driver, CUDA, GPUs, tests, tokens/s, and the bf16
# first-step ratio spread at a real model's logit scale. Sized for under 8 minutes on one H200: each stage runs under
# `timeout` (install 180 s, tests 190 s, bench 80 s).
#
#   gpu_tests/first_gpu_run.sh                        # exit 0: installed, every test passed, bench measured
#   RL_FIRST_RUN_OUT=/some/dir gpu_tests/first_gpu_run.sh   # also keep pytest.log, junit.xml, numbers.jsonl, bench.json
#
# Refuses (exit 2, one line, before installing anything) a machine without an NVIDIA driver, or with a driver older
# than the CUDA of uv.lock's torch needs (R580 for CUDA 13; rl.gpu.MIN_DRIVER_FOR_CUDA). Needs network for the install.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
INSTALL_S="${RL_FIRST_RUN_INSTALL_S:-180}"
TESTS_S="${RL_FIRST_RUN_TESTS_S:-190}"
BENCH_S="${RL_FIRST_RUN_BENCH_S:-80}"
PROC_VERSION="${RL_PROC_DRIVER_VERSION:-/proc/driver/nvidia/version}"
started=$SECONDS

refuse() {
  echo "first_gpu_run: $*" >&2
  exit 2
}

# -- preflight: bash alone, nothing installed yet
driver=""
if [[ -r "$PROC_VERSION" ]]; then
  driver="$(sed -nE 's/.*Kernel Module( for [^ ]+)? +([0-9]+\.[0-9]+(\.[0-9]+)?).*/\2/p' "$PROC_VERSION" | head -n1)"
fi
if [[ -z "$driver" ]] && command -v nvidia-smi >/dev/null 2>&1; then
  driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' ')" || true
fi
[[ -n "$driver" ]] || refuse "no NVIDIA driver: neither $PROC_VERSION nor nvidia-smi reports one; run this on a machine with an NVIDIA GPU"
need=525
grep -q -- '-cu13' uv.lock && need=580  # uv.lock's torch pulls nvidia-*-cu13: CUDA 13 needs an R580+ driver
(( ${driver%%.*} >= need )) || refuse "NVIDIA driver $driver is older than R$need, which the CUDA of uv.lock's torch needs (CUDA 13 needs R580+); upgrade the driver"
gpus="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | paste -sd ';' -)" || gpus="?"
echo "== first_gpu_run: driver $driver (needs R$need+); GPUs: ${gpus:-?}"

work="${RL_FIRST_RUN_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/rl-first-gpu-run.XXXXXX")}"
mkdir -p "$work"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RL_GPU_STRICT=1
export RL_GPU_REPORT="$work/numbers.jsonl"
: >"$RL_GPU_REPORT"

# -- install uv.lock into a fresh virtualenv
echo "== first_gpu_run: install uv.lock (budget ${INSTALL_S} s)"
if ! command -v uv >/dev/null 2>&1; then
  if command -v python3 >/dev/null 2>&1 && python3 -m pip install -q --user uv >/dev/null 2>&1; then
    export PATH="$HOME/.local/bin:$PATH"
  else
    curl -LsSf https://astral.sh/uv/install.sh | sh >/dev/null && export PATH="$HOME/.local/bin:$PATH"
  fi
fi
export UV_PROJECT_ENVIRONMENT="$work/venv"
install_status=0
timeout --kill-after=10 "$INSTALL_S" uv sync --locked --python 3.11 --extra gpu --extra test -q || install_status=$?
PY="$work/venv/bin/python"
[[ $install_status -eq 0 && -x "$PY" ]] || { echo "first_gpu_run: the install failed (exit $install_status)" >&2; exit 1; }

# -- the whole GPU tier, strictly
echo "== first_gpu_run: pytest gpu_tests -m gpu (budget ${TESTS_S} s)"
set +e
timeout --kill-after=15 "$TESTS_S" "$PY" -m pytest gpu_tests -m gpu -p no:cacheprovider -q -rA \
  --junitxml="$work/junit.xml" >"$work/pytest.log" 2>&1
test_status=$?
echo "== first_gpu_run: rl bench --gpu (budget ${BENCH_S} s)"
timeout --kill-after=10 "$BENCH_S" "$work/venv/bin/rl" bench --gpu --json >"$work/bench.log" 2>&1
bench_status=$?
set -e
tail -n 1 "$work/bench.log" >"$work/bench.json" || true

echo
echo "== first_gpu_run: report ($((SECONDS - started)) s)"
"$PY" - "$driver" "$work" "$test_status" "$bench_status" <<'REPORT'
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

driver, work, test_status, bench_status = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    import vllm

    vllm_version = vllm.__version__
except Exception as exc:  # reported, not fatal: the tests say what failed
    vllm_version = f"not importable ({type(exc).__name__})"
names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or "none visible"
print(f"driver {driver}; torch {torch.__version__} (CUDA {torch.version.cuda}); vllm {vllm_version}; GPUs: {names}")

numbers = {}
for line in (work / "numbers.jsonl").read_text().splitlines():
    if line.strip():
        row = json.loads(line)
        numbers.setdefault(row.pop("test"), {}).update(row)
counts = {"passed": 0, "failed": 0, "skipped": 0}
rows = []
junit = work / "junit.xml"
if junit.is_file():
    for case in ET.parse(junit).getroot().iter("testcase"):
        result = "passed"
        for tag, label in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
            if case.find(tag) is not None:
                result = label
                break
        counts[result] += 1
        rows.append(f"  {result:<8} {float(case.get('time', 0)):6.1f} s  {case.get('name')}")
timed_out = " (timed out)" if test_status in (124, 137) else ""
print(f"tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped; pytest exit "
      f"{test_status}{timed_out}")
print("\n".join(rows) or "  (no test results: see pytest.log)")

try:
    bench = json.loads((work / "bench.json").read_text())
except (OSError, ValueError):
    bench = {}
if bench:
    print(f"generate tokens/s: vLLM {bench.get('vllm_tokens_per_s', '-')}, HF {bench.get('hf_generate_tokens_per_s', '-')}"
          f" (vLLM/HF {bench.get('vllm_speedup', '-')}); CUDA train step {bench.get('train_step_s', '-')} s")
else:
    print(f"generate tokens/s: not measured (rl bench --gpu exit {bench_status}; see bench.log)")
ratio = next((v for k, v in numbers.items() if k.startswith("test_bf16_first_step_ratios")), None)
if ratio:
    print(f"bf16 first-step ratio spread (logits 16-32): min {ratio.get('min')}, p01 {ratio.get('p01')}, "
          f"p99 {ratio.get('p99')}, max {ratio.get('max')}, clipped {ratio.get('clipped_fraction')}")
else:
    print("bf16 first-step ratio spread: not measured (its test did not report)")
print(f"files: {work}")
REPORT

[[ $test_status -eq 0 && $bench_status -eq 0 ]] || exit 1
