#!/usr/bin/env bash
# Two trees side by side on the CPU VM, in one run: the rule tick and the replay speed
# alternate between the trees (each tree runs its own copy of the bench script, so an API
# change between them does not matter), then both trees' daemons run at the same time with
# 8 recorded GPUs. Each figure is printed per round; quote medians and ratios.
# Usage (repo root): bash bench/ab_cpu.sh OTHER_TREE [ROUNDS] [DAEMON_SECONDS]
# OTHER_TREE: a checkout of the other commit (git worktree add /tmp/old REV).
# Output: .out/ab/*.txt and *.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OTHER=$(cd "$1" && pwd)
ROUNDS=${2:-3}
SECONDS_EACH=${3:-60}
PY=${PY:-$PWD/.venv/bin/python}
THIS=$PWD
O=$PWD/.out/ab
mkdir -p "$O"
REC=tests/fixtures/h200/nvml_recording_h200.jsonl
run() {  # tree label name args...
    local tree=$1 label=$2 name=$3; shift 3
    (cd "$tree" && PYTHONPATH=$tree "$PY" "$@" >"$O/${name}_${label}.txt" 2>&1)
}
for r in $(seq "$ROUNDS"); do
    for side in other this; do
        tree=$OTHER; [ "$side" = this ] && tree=$THIS
        run "$tree" "${side}_$r" rules_tick bench/rules_tick.py --ticks 300
        run "$tree" "${side}_$r" replay_speed bench/replay_speed.py --minutes 60
    done
    echo "round $r rule tick: other $(grep -h 'tick:' "$O/rules_tick_other_$r.txt")"
    echo "round $r rule tick: this  $(grep -h 'tick:' "$O/rules_tick_this_$r.txt")"
    echo "round $r replay:    other $(tail -n1 "$O/replay_speed_other_$r.txt" | cut -c1-90)"
    echo "round $r replay:    this  $(tail -n1 "$O/replay_speed_this_$r.txt" | cut -c1-90)"
done
for r in $(seq "$ROUNDS"); do
    run "$OTHER" "other_$r" steady bench/daemon_steady.py --seconds "$SECONDS_EACH" --warmup 10 \
        --scrape-every 15 --recording "$REC" --gpus 8 --out "$O/steady_other_$r.json" &
    run "$THIS" "this_$r" steady bench/daemon_steady.py --seconds "$SECONDS_EACH" --warmup 10 \
        --scrape-every 15 --recording "$REC" --gpus 8 --out "$O/steady_this_$r.json" &
    wait
    echo "round $r daemon: other $(grep -ho '"cpu_percent_of_one_core": [0-9.]*' "$O/steady_other_$r.json")" \
        "this $(grep -ho '"cpu_percent_of_one_core": [0-9.]*' "$O/steady_this_$r.json")"
done
