#!/usr/bin/env bash
# Instructions per request (callgrind's Ir) of the benchmark server, per variant, against
# the bare handler in the same run: see "Instructions per request" in README.md here.
#
# For each variant and repetition it starts the release server under
# `valgrind --tool=callgrind --instr-atstart=no`, sends a warm-up, switches the
# instrumentation on (`callgrind_control -i on`), sends N fresh-key requests one at a
# time on one connection (src/bin/callgrind_client.rs, run natively), switches it off and
# dumps; then replays a set of the keys it just completed once (not counted), and counts
# N more replays of them the same way. Ir per request = the dump's total / N. Counts
# repeat to a fraction of a percent on a busy machine, where times do not.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

DEFAULT_VARIANTS="bare,idempotent-memory,idempotent-sqlite-normal"

usage() {
    cat <<EOF
usage: bench/http/callgrind.sh [-v VARIANTS] [-n REQUESTS] [-r REPS] [-w WARMUP]
                               [-k REPLAY_KEYS] [-t WORKERS] [--no-build]

  -v, --variants LIST   comma-separated server variants (default: $DEFAULT_VARIANTS);
                        any name the server knows (bare, fingerprint-only, floor-memory,
                        idempotent-memory, idempotent-sqlite-normal, ...)
  -n, --requests N      requests counted per phase (default 1000)
  -r, --reps N          repetitions; the table shows medians (default 3)
  -w, --warmup N        fresh-key requests sent before counting starts (default 200)
  -k, --replay-keys N   how many of the counted fresh keys the replay phase cycles
                        through (default 100; replayed once uncounted first)
  -t, --workers N       tokio worker threads of the server (TOKIO_WORKER_THREADS;
                        default 1: valgrind runs one thread at a time anyway, and one
                        worker keeps idle-worker spinning out of the counts)
      --no-build        use the release binaries already built

Output: one markdown table (Ir per request, median of the repetitions, and the
difference from bare), plus the dumps and callgrind_annotate's inclusive listing of the
median repetition of each phase in target/callgrind/ (see README.md here).
Environment: BENCH_CG_PORT (38180), IDEMPOTENT_BENCH_* store URLs as for run.sh.
Takes about 1 minute per variant and repetition at the defaults.
EOF
}

variants="$DEFAULT_VARIANTS"
requests=1000
reps=3
warmup=200
replay_keys=100
workers=1
build=1
while [ $# -gt 0 ]; do
    case "$1" in
        -v|--variants) variants="$2"; shift 2 ;;
        -n|--requests) requests="$2"; shift 2 ;;
        -r|--reps) reps="$2"; shift 2 ;;
        -w|--warmup) warmup="$2"; shift 2 ;;
        -k|--replay-keys) replay_keys="$2"; shift 2 ;;
        -t|--workers) workers="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
if [ "$replay_keys" -gt "$requests" ]; then
    echo "--replay-keys ($replay_keys) must not exceed --requests ($requests)" >&2
    exit 2
fi

for tool in valgrind callgrind_control callgrind_annotate; do
    command -v "$tool" >/dev/null || { echo "$tool not found (apt-get install valgrind)" >&2; exit 1; }
done

port="${BENCH_CG_PORT:-38180}"
addr="127.0.0.1:$port"
body="$here/wrk/order.json"
target="$here/target"
server="$target/release/idempotent-http-bench"
client="$target/release/callgrind_client"
out="$target/callgrind"

if [ "$build" = 1 ]; then
    cargo build --release --quiet --bin idempotent-http-bench --bin callgrind_client
fi
mkdir -p "$out"

pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# The client, bounded in time (a server stuck under valgrind must not hang the run).
send() {
    timeout 600 "$client" --addr "$addr" --body "$body" "$@"
}

# The total Ir of one callgrind dump file.
total_ir() {
    # `summary:` stays 0 when the instrumentation was switched on mid-run; `totals:` counts.
    awk '/^totals:/ { print $2; exit }' "$1"
}

# Runs one repetition of one variant; writes "<variant> <rep> <fresh Ir> <replay Ir>"
# to $out/results.tsv.
measure() {
    local variant="$1" rep="$2"
    local dir="$out/$variant-$rep"
    rm -rf "$dir"
    mkdir -p "$dir/data"
    TOKIO_WORKER_THREADS="$workers" valgrind --tool=callgrind --instr-atstart=no \
        --callgrind-out-file="$dir/callgrind.out" \
        "$server" --variant "$variant" --addr "$addr" --data-dir "$dir/data" \
        >"$dir/server.log" 2>&1 &
    pid=$!
    local waited=0
    until grep -q '^ready' "$dir/server.log"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$variant: the server exited; its log:" >&2
            cat "$dir/server.log" >&2
            return 1
        fi
        waited=$((waited + 1))
        if [ "$waited" -gt 600 ]; then
            echo "$variant: not ready after 60 s" >&2
            return 1
        fi
        sleep 0.1
    done

    send --prefix warm --count "$warmup"
    # Fresh keys, counted.
    callgrind_control -i on "$pid" >/dev/null 2>&1
    send --prefix fresh --count "$requests"
    callgrind_control -i off "$pid" >/dev/null 2>&1
    callgrind_control -d fresh "$pid" >/dev/null 2>&1
    # Replays of the first keys just completed: once uncounted, then counted.
    send --prefix fresh --count "$replay_keys"
    callgrind_control -i on "$pid" >/dev/null 2>&1
    send --prefix fresh --count "$requests" --cycle "$replay_keys"
    callgrind_control -i off "$pid" >/dev/null 2>&1
    callgrind_control -d replay "$pid" >/dev/null 2>&1

    kill -TERM "$pid"
    wait "$pid" || { echo "$variant: the server exited with $?" >&2; return 1; }
    pid=""
    local fresh replay
    fresh="$(total_ir "$dir/callgrind.out.1")"
    replay="$(total_ir "$dir/callgrind.out.2")"
    printf '%s\t%s\t%s\t%s\n' "$variant" "$rep" "$fresh" "$replay" >>"$out/results.tsv"
    printf '%-26s rep %s: fresh %s Ir/request, replay %s Ir/request\n' "$variant" "$rep" \
        $((fresh / requests)) $((replay / requests)) >&2
}

: >"$out/results.tsv"
IFS=, read -ra names <<<"$variants"
# Interleaved: every variant once, then every variant again.
for rep in $(seq 1 "$reps"); do
    for variant in "${names[@]}"; do
        measure "$variant" "$rep"
    done
done

# The median repetition of a variant's phase (column 3: fresh, 4: replay): "<Ir> <rep>".
median() {
    awk -F'\t' -v v="$1" -v col="$2" '$1 == v { print $col, $2 }' "$out/results.tsv" |
        sort -n | awk '{ a[NR] = $0 } END { print a[int((NR + 1) / 2)] }'
}

echo
echo "callgrind, Ir per request (median of $reps; $requests requests per phase, one connection," \
    "$workers tokio worker(s), $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo
echo "| variant | fresh keys, Ir/request | − bare | replays, Ir/request | − bare |"
echo "|---|---|---|---|---|"
read -r bare_fresh _ <<<"$(median bare 3)"
read -r bare_replay _ <<<"$(median bare 4)"
for variant in "${names[@]}"; do
    read -r fresh fresh_rep <<<"$(median "$variant" 3)"
    read -r replay replay_rep <<<"$(median "$variant" 4)"
    if [ -n "${bare_fresh:-}" ]; then
        d_fresh=$(((fresh - bare_fresh) / requests))
        d_replay=$(((replay - bare_replay) / requests))
    else
        d_fresh="—"
        d_replay="—"
    fi
    echo "| $variant | $((fresh / requests)) | $d_fresh | $((replay / requests)) | $d_replay |"
    callgrind_annotate --inclusive=yes --threshold=99.5 \
        "$out/$variant-$fresh_rep/callgrind.out.1" >"$out/$variant-fresh.annotate.txt" 2>&1 || true
    callgrind_annotate --inclusive=yes --threshold=99.5 \
        "$out/$variant-$replay_rep/callgrind.out.2" >"$out/$variant-replay.annotate.txt" 2>&1 || true
done
echo
echo "Dumps in $out/<variant>-<rep>/callgrind.out.{1,2} (fresh, replay);" \
    "inclusive listings in $out/<variant>-{fresh,replay}.annotate.txt."
