#!/usr/bin/env bash
# Two trees' daemons side by side on a GPU host: the gpu-marked tests on this tree, then
# twice `bench/daemon_steady.py` on the live NVML backend for both trees at the same
# time. The other tree is a plain copy of the repository at another commit, carried along
# (git archive REV moptd rules bench tests | tar -x -C DIR: daemon_steady.py imports its
# helpers from tests/), at 6cd7f83 or later (its daemon_steady.py takes --ports).
# Results go to $OUT (or ./.out).
# Usage (from the repo root, on the GPU host): bash bench/gpu_host_ab.sh OTHER_TREE [SECONDS]
set -u
OTHER=$(cd "$1" && pwd)
SECONDS_EACH=${2:-150}
source bench/gpu_host_env.sh  # $OUT, $SITE, the wheels, steady()
nvidia-smi -L >"$OUT/env.txt"
PYTHONPATH=$PWD:$SITE timeout 300 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider \
    -o addopts="" >"$OUT/gpu_tests.log" 2>&1
echo "rc=$?" >>"$OUT/gpu_tests.log"
tail -2 "$OUT/gpu_tests.log"
for r in 1 2; do
    steady "$OTHER" "other_$r" 29400-29449 & steady "$PWD" "this_$r" 29450-29499 & wait
    echo "round $r: other $(grep -h cpu_percent "$OUT/other_$r.json") this $(grep -h cpu_percent "$OUT/this_$r.json")"
done
