#!/usr/bin/env bash
# Download, here (where PyPI is reachable), the wheels the lent device machine lacks, for its Python 3.12 on x86_64
# Linux: pydantic and flyte (uv.lock's pins) and their dependencies, ~31 MB, into .device-wheels/ (git-ignored). The
# device check (gpu_tests/device_check.py --wheels .device-wheels) unpacks those the machine lacks: no network.
#
#   scripts/gpu/device_wheels.sh [DIR]      # default DIR: .device-wheels in the repository root
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${1:-$repo/.device-wheels}"
pin="$(awk '/^name = "pydantic"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' "$repo/uv.lock")"
[[ -n "$pin" ]] || { echo "device_wheels: no pydantic pin found in uv.lock" >&2; exit 2; }
# Flyte too: the device check runs production's clustered step through Flyte's task runner (gpu_tests/clustered_step.py).
# Its wheels and its dependencies' are ~30 MB; the check unpacks only those whose modules the machine lacks.
flyte_pin="$(awk '/^name = "flyte"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' "$repo/uv.lock")"
[[ -n "$flyte_pin" ]] || { echo "device_wheels: no flyte pin found in uv.lock" >&2; exit 2; }
mkdir -p "$dest"
python3 -m pip download --quiet --dest "$dest" --only-binary=:all: --implementation cp --python-version 3.12 \
  --abi cp312 --abi abi3 --abi none --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_28_x86_64 --platform any "pydantic==$pin" "flyte==$flyte_pin"
echo "device_wheels: $(ls "$dest" | wc -l) wheels, $(du -sh "$dest" | cut -f1), in $dest"
