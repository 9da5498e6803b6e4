#!/usr/bin/env bash
# How long a fresh machine takes to set up the unit session: a new virtualenv plus `.[test]` with the CPU torch, as
# `nox -s unit --install-only` does it, by pip (virtualenv backend) and by uv, each with an empty download/build cache
# (a fresh CI machine) and then again with the cache that first run filled. A benchmark, not a test: it prints numbers.
#
#   scripts/bench_setup.sh             # needs nox on PATH; the uv rows need uv beside it (pip install 'nox[uv]')
#   env -u PYTHONDONTWRITEBYTECODE scripts/bench_setup.sh   # uv without byte-compiling (see noxfile._uv_compile)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d "${TMPDIR:-/tmp}/rl-bench-setup-XXXXXX")
trap 'rm -rf "$work"' EXIT

# uv counts if nox can find it: on PATH, or installed in nox's own environment (`pip install 'nox[uv]'`).
backends=(virtualenv)
for python in "$(head -1 "$(command -v nox)" | sed -n 's/^#!//p')" python3; do
  if $python -c 'import sys; from nox.virtualenv import find_uv; sys.exit(not find_uv()[0])' 2>/dev/null; then
    backends+=(uv)
    break
  fi
done
((${#backends[@]} > 1)) || echo "nox finds no uv: only the pip rows (pip install 'nox[uv]' adds uv)" >&2

[ -z "${PYTHONDONTWRITEBYTECODE:-}" ] || echo "PYTHONDONTWRITEBYTECODE is set: uv byte-compiles at install, as pip does (noxfile.py)"
printf '%-10s %-6s %8s %8s\n' backend cache seconds venv
for backend in "${backends[@]}"; do
  export PIP_CACHE_DIR="$work/$backend-pip-cache" UV_CACHE_DIR="$work/$backend-uv-cache"
  for cache in cold warm; do
    envdir="$work/$backend-$cache"
    start=$(date +%s%N)
    nox --force-venv-backend "$backend" --envdir "$envdir" -s unit --install-only >"$work/$backend-$cache.log" 2>&1 ||
      { cat "$work/$backend-$cache.log" >&2; exit 1; }
    ms=$((($(date +%s%N) - start) / 1000000))
    printf '%-10s %-6s %6d.%d %8s\n' "$backend" "$cache" $((ms / 1000)) $((ms % 1000 / 100)) "$(du -sh "$envdir/unit" | cut -f1)"
  done
done
echo "$(nproc) CPUs; $(uptime)"
