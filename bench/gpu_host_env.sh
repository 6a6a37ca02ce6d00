# Sourced by the bench/gpu_host_*.sh scripts (and gpu_daemon_extrapolate.sh) on a lent GPU
# host, from the repository root: $OUT made and made absolute (default ./.out); the wheels
# brought in .whl/ (the host reaches no package index: pytest-asyncio, jsonschema, ...)
# unpacked into $SITE; and steady(), one bench/daemon_steady.py run of a tree.
OUT=${OUT:-.out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SITE=/tmp/moptd-site
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl
fi
export PYTHONUNBUFFERED=1

# steady TREE NAME PORTS [daemon_steady.py options...]: TREE's daemon (a repository copy
# whose daemon_steady.py takes --ports: 6cd7f83 on) for $SECONDS_EACH s, a /metrics scrape
# every 15 s after ${WARMUP:-10} s, into $OUT/NAME.json and NAME.txt. Daemons started at
# once each need a range of their own: each would take the lowest free port, and one fail
# to bind (its figure then reads 0.0).
steady() {
    local tree=$1 name=$2 ports=$3
    shift 3
    (cd "$tree" && PYTHONPATH=$tree:$SITE timeout $((SECONDS_EACH + 90)) python3 \
        bench/daemon_steady.py --seconds "$SECONDS_EACH" --warmup "${WARMUP:-10}" \
        --scrape-every 15 --ports "$ports" "$@" --out "$OUT/$name.json" >"$OUT/$name.txt" 2>&1)
}
