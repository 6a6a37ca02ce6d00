#!/usr/bin/env bash
# Every CPU-side benchmark in one run, one after the other on an otherwise idle machine,
# so the figures in BENCHMARKS.md come from the same conditions. Output: .out/cpu/*.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
O=.out/cpu
mkdir -p "$O"
run() { local name=$1; shift; echo "== $(date +%T) $name"; "$@" >"$O/$name.txt" 2>&1; tail -n 15 "$O/$name.txt"; }
run store_memory      $PY bench/store_memory.py --gpus 8 --hours 1 --out "$O/store_memory.json"
run rules_tick        $PY bench/rules_tick.py --ticks 300
run rules_tick_flood  $PY bench/rules_tick.py --ticks 100 --flood 10000
run rules_tick_flood_plain $PY bench/rules_tick.py --ticks 10 --flood 10000 --plain-count
run replay_speed      $PY bench/replay_speed.py --minutes 60
run kernel_parse      $PY bench/kernel_parse_throughput.py --records 100000 --out "$O/parse.json"
run kmsg_latency      $PY bench/kmsg_latency.py --records 1000 --out "$O/kmsg_latency.json"
run detection_latency $PY bench/detection_latency.py --rounds 30 --out "$O/detection_latency.json"
run serving_scrape    $PY bench/serving_scrape.py --runs 500
run steady_cpu_host   $PY bench/daemon_steady.py --seconds 60 --warmup 10 --out "$O/steady_cpu.json"
run steady_8gpu       $PY bench/daemon_steady.py --seconds 60 --warmup 10 \
    --recording tests/fixtures/h200/nvml_recording_h200.jsonl --gpus 8 --out "$O/steady_8gpu.json"
echo "== $(date +%T) done"
