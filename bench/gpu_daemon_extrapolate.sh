#!/usr/bin/env bash
# Issue 32's second GPU goal (the whole daemon at most 0.5 % of a core for 8 live GPUs) on a
# host lent fewer than 8 GPUs: the extrapolation the issue allows, from daemons run side by
# side for the same SECONDS on the same machine (bench/daemon_steady.py, a /metrics scrape
# every 15 s):
#   live1    the live GPU 0 through NVML                         L1
#   rec1     the recorded H200 capture, 1 GPU (no NVML calls)      R1
#   rec8     the same capture replicated to 8 GPUs                 R8
# L1 - R1 is what one live GPU's NVML calls cost over the recorded backend's reads; the rest
# of the daemon (store, rules, exporter, scrapes) grows with the GPUs as R8 shows, so
#   L8 ~= R8 + 8 x (L1 - R1).
# Each runs twice: at the default cadences and at nvml.profile_interval=30,
# nvml.slow_interval=10 (suffix _c30), the cheaper cadence BENCHMARKS.md prices.
# Six daemons at once on a 16-core host, each with its own port range (steady() in
# gpu_host_env.sh). Results (JSON and logs) go to $OUT (or ./.out).
# Usage (repo root, GPU host): bash bench/gpu_daemon_extrapolate.sh [SECONDS]
set -u
SECONDS_EACH=${1:-180}
WARMUP=15
source bench/gpu_host_env.sh  # $OUT, $SITE, the wheels, steady()
REC=tests/fixtures/h200/nvml_recording_h200.jsonl
C30=(--option nvml.profile_interval=30 --option nvml.slow_interval=10)
{ nvidia-smi --query-gpu=name,driver_version,pstate --format=csv; nproc; uptime; python3 -V
  git rev-parse HEAD 2>/dev/null; } >"$OUT/env.txt" 2>&1
steady "$PWD" live1 29400-29409 &
steady "$PWD" live1_c30 29410-29419 "${C30[@]}" &
steady "$PWD" rec1 29420-29429 --recording "$REC" --gpus 1 &
steady "$PWD" rec8 29430-29439 --recording "$REC" --gpus 8 &
steady "$PWD" rec1_c30 29440-29449 --recording "$REC" --gpus 1 "${C30[@]}" &
steady "$PWD" rec8_c30 29450-29459 --recording "$REC" --gpus 8 "${C30[@]}" &
wait
uptime >>"$OUT/env.txt"
python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
fig = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json") if p.stem != "summary"}
for name in sorted(fig):
    f = fig[name]
    print(f"{name:10} cpu {f['cpu_percent_of_one_core']:.3f} %  rss {f['rss_mb_max']:.1f} MB  "
          f"scrape p99 {f['scrape_ms_p99']:.2f} ms")
for sfx in ("", "_c30"):
    try:
        l1, r1, r8 = (fig[n + sfx]["cpu_percent_of_one_core"] for n in ("live1", "rec1", "rec8"))
    except KeyError:
        continue
    print(f"L8{sfx or ' (defaults)'} ~= {r8:.3f} + 8 x ({l1:.3f} - {r1:.3f}) = {r8 + 8 * (l1 - r1):.2f} % of a core")
EOF
