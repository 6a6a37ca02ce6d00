#!/usr/bin/env bash
# Two trees' daemons side by side on a GPU host: the gpu-marked tests on this tree, then
# twice `bench/daemon_steady.py` on the live NVML backend for both trees at the same
# time. The other tree is a plain copy of the repository at another commit, carried along
# (git archive REV moptd rules bench tests | tar -x -C DIR: daemon_steady.py imports its
# helpers from tests/).
# Results go to $OUT (or ./.out).
# Usage (from the repo root, on the GPU host): bash bench/gpu_host_ab.sh OTHER_TREE [SECONDS]
set -u
OTHER=$(cd "$1" && pwd)
SECONDS_EACH=${2:-150}
OUT=${OUT:-.out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/moptd-site .whl/*.whl
fi
SITE=/tmp/moptd-site
export PYTHONUNBUFFERED=1
nvidia-smi -L >"$OUT/env.txt"
PYTHONPATH=$PWD:$SITE timeout 300 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider \
    -o addopts="" >"$OUT/gpu_tests.log" 2>&1
echo "rc=$?" >>"$OUT/gpu_tests.log"
tail -2 "$OUT/gpu_tests.log"
steady() {  # tree, output name
    (cd "$1" && PYTHONPATH=$1:$SITE timeout $((SECONDS_EACH + 70)) python3 bench/daemon_steady.py \
        --seconds "$SECONDS_EACH" --warmup 10 --scrape-every 15 --out "$OUT/$2.json" \
        >"$OUT/$2.txt" 2>&1)
}
OUT=$(cd "$OUT" && pwd)
for r in 1 2; do
    steady "$OTHER" "other_$r" & steady "$PWD" "this_$r" & wait
    echo "round $r: other $(grep -h cpu_percent "$OUT/other_$r.json") this $(grep -h cpu_percent "$OUT/this_$r.json")"
done
