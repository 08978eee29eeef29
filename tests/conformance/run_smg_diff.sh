#!/usr/bin/env bash
# Differential conformance run: every case file in cases/ is sent to SMG 1.13.0 and to smgrl by
# smg-diff (a differential request replayer, not in this repository: SMG_DIFF names it), both
# launched with the same flags against the same engines.
# Results go to last-run/<case>.txt; RESULTS.md explains every remaining difference (D1-D5).
#
#   tests/conformance/run_smg_diff.sh [case ...]      # default: all case files
#
# Needs smg==1.13.0 (SMG_BIN, default /tmp/smgvenv/bin/smg); without it the run is skipped
# (exit 0), so CI without SMG is unaffected. Loopback only; every process started here is
# stopped by its PID on exit.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SMG=${SMG_BIN:-/tmp/smgvenv/bin/smg}
SMGRL=${SMGRL_BIN:-$ROOT/.venv/bin/smgrl}
PY=${PYTHON:-$ROOT/.venv/bin/python}
DIFF=${SMG_DIFF:-smg-diff}
DIFF=$(command -v "$DIFF" || echo "$DIFF")
OUT=$HERE/last-run
if [ ! -x "$SMG" ] || [ ! -x "$DIFF" ]; then
    echo "smg ($SMG) or smg-diff ($DIFF) not available: conformance run skipped"
    exit 0
fi
TMP=$(mktemp -d)
mkdir -p "$OUT"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    rm -rf "$TMP"
}
trap cleanup EXIT

# start NAME CMD...: run an engine process whose first stdout line is {"ready": true, "urls": [...]}
# (not in a $(...) subshell: its PID must reach PIDS for the cleanup)
start() {
    local name=$1; shift
    "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    PIDS+=($!)
}
urls_of() {
    for _ in $(seq 100); do
        [ -s "$TMP/$1.out" ] && break
        sleep 0.1
    done
    "$PY" -c 'import json,sys; print(" ".join(sorted(json.loads(open(sys.argv[1]).readline())["urls"])))' \
        "$TMP/$1.out" 2>/dev/null
}

start fake "$SMGRL" fake-engine --kind sglang --ports 0,0,0
start dp "$SMGRL" fake-engine --kind sglang --ports 0,0 --dp-size 2
start raw "$PY" "$HERE/raw_engine.py" 0 0 0
FAKE=$(urls_of fake)
DP=$(urls_of dp)
RAW=$(urls_of raw)
[ -n "$FAKE" ] && [ -n "$DP" ] && [ -n "$RAW" ] || { echo "engines did not start"; exit 2; }

KEYS="--control-plane-api-keys adm:Admin:admin:admin-secret usr:User:user:user-secret --tenant-api-key t1:tenant-secret"
# case -> engines | flags | admin key
declare -A ENGINES=([discovery]=$FAKE [proxy]=$RAW [fanout]=$RAW [errors]=$RAW [auth]=$FAKE
                    [dp-aware]=$DP [workers]=$RAW
                    [dataplane]=$FAKE [gateway]=$FAKE)
declare -A FLAGS=(
    [discovery]="--enable-rl"
    [proxy]="--enable-rl --rl-control-timeout-secs 1"
    [fanout]="--enable-rl --rl-control-timeout-secs 1 --rl-fanout-concurrency 2"
    [errors]="--enable-rl --max-payload-size 100"
    [auth]="--enable-rl $KEYS"
    [dp-aware]="--enable-rl --dp-aware"
    [workers]="--enable-rl --max-payload-size 100000"
    [dataplane]="--enable-rl"
    [gateway]="--enable-rl"
)
declare -A ADMIN=([auth]=admin-secret)

CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(discovery proxy fanout errors auth dp-aware workers dataplane gateway)
status=0
for name in "${CASES[@]}"; do
    urls=(${ENGINES[$name]})
    # {url:N} stands for the N-th engine URL (sorted, so the N-th discovery row's base URL).
    file=$TMP/$name.jsonl
    cp "$HERE/cases/$name.jsonl" "$file"
    for i in "${!urls[@]}"; do
        sed -i "s#{url:$i}#${urls[$i]}#g" "$file"
    done
    key=()
    [ -n "${ADMIN[$name]:-}" ] && key=(--admin-key "${ADMIN[$name]}")
    "$DIFF" --worker-urls "${urls[@]}" --flags="${FLAGS[$name]}" --requests "$file" "${key[@]}" \
        --smg-bin "$SMG" --smgrl-bin "$SMGRL" >"$OUT/$name.txt" 2>&1 || status=1
    echo "$name: $(tail -n 1 "$OUT/$name.txt")"
done
exit $status
