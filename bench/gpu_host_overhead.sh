#!/usr/bin/env bash
# Issue 32's GPU goals on a GPU host, this tree against another, in one go (device time is
# scarce): the collector's fast tick against the bare reads on a worker thread, under a
# profiler and side by side (bench/nvml_overhead.py --other); its amortised tick
# (bench/nvml_tick_ab.py); the bare amortised NVML floor per GPU (bench/nvml_cost.py's
# bare_cost); both trees' whole daemons on the live GPU(s) at the same time
# (bench/daemon_steady.py, a /metrics scrape every 15 s); then the gpu-marked tests.
# The other tree is a plain copy of the repository at another commit
# (git archive REV moptd rules bench tests pyproject.toml | tar -x -C DIR).
# Results go to $OUT (or ./.out). Shorter, for a short lease: PROFILE_TICKS=0 (no profile),
# RUNS=1 (TICK_ROUNDS=1 for nvml_tick_ab.py alone), TESTS=0 (no gpu-marked tests), SECONDS 45.
# Usage (from the repo root, on the GPU host): bash bench/gpu_host_overhead.sh OTHER_TREE [SECONDS]
set -u
OTHER=$(cd "$1" && pwd)
SECONDS_EACH=${2:-80}
source bench/gpu_host_env.sh  # $OUT, $SITE, the wheels, steady()
log() { echo "== $(date +%T) $*"; }
{ nvidia-smi --query-gpu=name,driver_version,pstate,persistence_mode --format=csv; nproc;
  uptime; python3 -V; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
PROFILE_TICKS=${PROFILE_TICKS:-500}
if [ "$PROFILE_TICKS" != 0 ]; then
    log "profiles"
    timeout 60 python3 bench/nvml_profile.py --ticks "$PROFILE_TICKS" --tree "$OTHER" \
        >"$OUT/profile_other.txt" 2>&1
    timeout 60 python3 bench/nvml_profile.py --ticks "$PROFILE_TICKS" >"$OUT/profile_this.txt" 2>&1
fi
log "fast tick against the bare reads on a worker thread"
timeout 300 python3 bench/nvml_overhead.py --other "$OTHER" --runs "${RUNS:-2}" --out "$OUT/overhead_ab.json" \
    >"$OUT/overhead_ab.txt" 2>&1
tail -4 "$OUT/overhead_ab.txt"
log "fast and amortised tick, both trees"
PYTHONPATH=$PWD timeout 120 python3 bench/nvml_tick_ab.py --other "$OTHER" --rounds "${TICK_ROUNDS:-${RUNS:-2}}" \
    >"$OUT/tick_ab.txt" 2>&1
tail -3 "$OUT/tick_ab.txt"
log "bare amortised NVML floor"
PYTHONPATH=$PWD timeout 60 python3 -c '
import json, statistics, sys
sys.path.insert(0, "bench")
from nvml_cost import bare_cost
from moptd.gpu.backend import NvmlBackend
b = NvmlBackend(); b.init(); r = bare_cost(b, 5); b.shutdown()
print(json.dumps({k: statistics.median(v) * 1e6 for k, v in r.items()}))
' >"$OUT/bare_amortised.json" 2>&1
cat "$OUT/bare_amortised.json"
log "daemons, both trees at once, ${SECONDS_EACH} s"
steady "$OTHER" steady_other 29400-29449 & steady "$PWD" steady_this 29450-29499 & wait
grep -h '"cpu_percent\|scrape_ms_p99\|rss_mb_max' "$OUT/steady_other.json" "$OUT/steady_this.json"
if [ "${TESTS:-1}" != 0 ]; then
    log "gpu-marked tests"
    PYTHONPATH=$PWD:$SITE timeout 120 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider \
        -o addopts="" >"$OUT/gpu_tests.log" 2>&1
    echo "rc=$?" >>"$OUT/gpu_tests.log"
    tail -2 "$OUT/gpu_tests.log"
fi
log "done"
