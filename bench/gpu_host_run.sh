#!/usr/bin/env bash
# Everything moptd checks on a real GPU host, in one go (device time is scarce): the
# gpu-marked tests, the side-by-side NVML cost benchmark, a live `moptd run` (scrape,
# status, an Xid record written to /dev/kmsg for GPU 0, explain, record -> replay) and
# the steady-state cost of the daemon. Results go to $OUT (or ./.out) as one tarball.
# Usage (from the repo root, on the GPU host): bash bench/gpu_host_run.sh
set -uo pipefail
# $OUT, and the wheels of .whl/ (gpustat, nvitop, pytest-asyncio and their dependencies)
# unpacked into $SITE
source bench/gpu_host_env.sh
mkdir -p "$OUT/r"
R=$OUT/r
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}:$SITE
log() { echo "== $(date +%T) $*"; }

log "environment"
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version,pstate,clocks_event_reasons.active --format=csv;
  python3 -c 'import pynvml; print("nvidia-ml-py", pynvml.__file__)'; } >"$R/env.txt" 2>&1

log "gpu-marked tests"
python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider -o addopts="" >"$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >>"$R/gpu_tests.log"

log "NVML cost, side by side"
python3 bench/nvml_cost.py --out "$R/nvml_cost.json" >"$R/nvml_cost.txt" 2>&1

if [ -f .whl/_nvml_prev.py ]; then
    log "previous collector against the current one"
    python3 bench/nvml_collector_compare.py --old .whl/_nvml_prev.py \
        --label-old "previous (3426b45)" --label-new "current" \
        >"$R/collector_compare.txt" 2>&1
fi

log "anchors polled once a second"
python3 bench/anchor_steady.py --seconds 30 --out "$R/anchors_steady.json" \
    >"$R/anchors_steady.txt" 2>&1

log "live daemon"
python3 bench/live_daemon_check.py --out "$R" >"$R/live_daemon.txt" 2>&1

log "steady state, 1 live GPU"
python3 bench/daemon_steady.py --seconds 60 --warmup 10 --out "$R/steady_live.json" \
    >"$R/steady_live.txt" 2>&1

tar -C "$OUT" -czf "$OUT/gpu_host_results.tar.gz" r && rm -rf "$R"
log "done"
