#!/usr/bin/env bash
# Instructions per request (callgrind's Ir) of the benchmark server, per variant, against
# the bare handler in the same run: see "Instructions per request" in README.md here.
#
# For each variant and repetition it starts the release server under
# `valgrind --tool=callgrind --instr-atstart=no`, sends a warm-up, then counts three
# phases of N requests each, sent one at a time on one connection by
# src/bin/callgrind_client.rs (run natively): for each, the instrumentation is switched
# on (`callgrind_control -i on`) around the requests, then off, and the counts dumped.
# The phases: N fresh keys; the first retry of each (the store answers); N replays of
# the last keys that the replay cache answers. Ir per request = the dump's total / N.
# Counts repeat to a fraction of a percent on a busy machine, where times do not.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

DEFAULT_VARIANTS="bare,idempotent-memory,idempotent-sqlite-normal"

usage() {
    cat <<EOF
usage: bench/http/callgrind.sh [-v VARIANTS] [-n REQUESTS] [-r REPS] [-w WARMUP]
                               [-k REPLAY_KEYS] [-t WORKERS] [-c CONNECTIONS]
                               [--no-build]

  -v, --variants LIST   comma-separated server variants (default: $DEFAULT_VARIANTS);
                        any name the server knows (bare, fingerprint-only, floor-memory,
                        idempotent-memory, idempotent-sqlite-normal, ...)
  -n, --requests N      requests counted per phase (default 1000)
  -r, --reps N          repetitions; the table shows medians (default 3)
  -w, --warmup N        warm-up keys, each sent three times before counting starts
                        (default 200)
  -k, --replay-keys N   how many of the counted fresh keys (the last ones) the cached
                        replays cycle through (default 100)
  -t, --workers N       tokio worker threads of the server (TOKIO_WORKER_THREADS;
                        default 1: valgrind runs one thread at a time anyway, and one
                        worker keeps idle-worker spinning out of the counts)
  -c, --connections N   clients sending at once, each on its connection, each a share
                        of the requests (default 1: one request at a time)
      --no-build        use the release binaries already built

Output: one markdown table (Ir per request, median of the repetitions, and the
difference from bare, for fresh keys, first retries and cached replays), plus the dumps
and callgrind_annotate's inclusive listing of the median repetition of each phase in
target/callgrind/ (see README.md here); callgrind_top.py breaks a dump down by function.
Environment: BENCH_CG_PORT (38180), IDEMPOTENT_BENCH_* store URLs as for run.sh;
BENCH_CG_SERVER, the server binary (default target/release/idempotent-http-bench: set it
to another build's, with --no-build, to compare two builds) and BENCH_CG_OUT, where the
dumps go (default target/callgrind); BENCH_CG_VALGRIND_ARGS, more callgrind options (say
--cache-sim=yes: the tables still show Ir, the dumps have the cache model's misses too).
Takes about 15 s per variant and repetition at the defaults (SQLite: 20 s).
EOF
}

variants="$DEFAULT_VARIANTS"
requests=1000
reps=3
warmup=200
replay_keys=100
workers=1
connections=1
build=1
while [ $# -gt 0 ]; do
    case "$1" in
        -v|--variants) variants="$2"; shift 2 ;;
        -n|--requests) requests="$2"; shift 2 ;;
        -r|--reps) reps="$2"; shift 2 ;;
        -w|--warmup) warmup="$2"; shift 2 ;;
        -k|--replay-keys) replay_keys="$2"; shift 2 ;;
        -t|--workers) workers="$2"; shift 2 ;;
        -c|--connections) connections="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
if [ $((requests % connections)) -ne 0 ] || [ $((replay_keys % connections)) -ne 0 ]; then
    echo "--requests and --replay-keys must be multiples of --connections" >&2
    exit 2
fi
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
server="${BENCH_CG_SERVER:-$target/release/idempotent-http-bench}"
client="$target/release/callgrind_client"
out="${BENCH_CG_OUT:-$target/callgrind}"

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

# A dump's Ir less those of SHA-256's block function: valgrind does not run the SHA
# extensions (SHA-NI), so under it sha2 takes its software path, about 57,000
# instructions for a 1 KiB body, where SHA-NI takes a few thousand.
less_sha() {
    local sha
    sha="$(python3 "$here/callgrind_top.py" --sum '^sha2::' "$1")"
    echo $(($(total_ir "$1") - sha))
}

# Sends from every connection at once: connection c uses the key prefix PREFIX<c> and
# the rest of the arguments as they are (counts are per connection).
send_each() {
    local prefix="$1"
    shift
    local c
    local clients=()
    for c in $(seq 1 "$connections"); do
        send --prefix "$prefix$c" "$@" &
        clients+=($!)
    done
    for c in "${clients[@]}"; do
        wait "$c"
    done
}

# Counts one phase: instrumentation on, the client's requests, off, and a dump named
# after the phase; prints how long the requests took.
counted() {
    local phase="$1"
    shift
    local started=$SECONDS
    callgrind_control -i on "$pid" >/dev/null 2>&1
    send_each "$@"
    callgrind_control -i off "$pid" >/dev/null 2>&1
    callgrind_control -d "$phase" "$pid" >/dev/null 2>&1
    echo $((SECONDS - started))
}

# Runs one repetition of one variant; appends
# "<variant> <rep> <fresh Ir> <first-retry Ir> <cached-replay Ir>" and the same three
# less SHA-256's block function to $out/results.tsv.
measure() {
    local variant="$1" rep="$2"
    local dir="$out/$variant-$rep"
    rm -rf "$dir"
    mkdir -p "$dir/data"
    : >"$dir/server.log"
    # shellcheck disable=SC2086 # BENCH_CG_VALGRIND_ARGS: words on purpose
    TOKIO_WORKER_THREADS="$workers" valgrind --tool=callgrind --instr-atstart=no \
        ${BENCH_CG_VALGRIND_ARGS:-} \
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

    # Warm-up, uncounted: fresh keys, and every path the counted phases take (a first
    # retry, a second, cached replays), so that one-time work (lazy statics, pools,
    # prepared statements, maps growing) is done before counting starts.
    local per=$((requests / connections)) keys=$((replay_keys / connections))
    send_each warm --count "$warmup"
    send_each warm --count "$warmup"
    send_each warm --count "$warmup"
    # 1. Fresh keys.
    local t1 t2 t3
    t1="$(counted fresh fresh --count "$per")"
    # 2. The first retry of each of those keys: the store answers it (the replay cache
    #    does not keep this process's own completions unless told to), and the engine
    #    caches the record.
    t2="$(counted first-retry fresh --count "$per")"
    # 3. Cached replays of the last keys: their second retry, uncounted (the cache hashes
    #    the request once to check it against the record, and keeps a copy of it), then
    #    counted ones, all answered by the cache by comparing bytes. The last keys, so
    #    that the phase ends within the cache's 10 s maximum age from their first retry.
    local first_replayed=$((per - keys + 1))
    send_each fresh --first "$first_replayed" --count "$keys"
    t3="$(counted cached-replay fresh --first "$first_replayed" --count "$per" \
        --cycle "$keys")"

    kill -TERM "$pid"
    wait "$pid" || { echo "$variant: the server exited with $?" >&2; return 1; }
    pid=""
    local fresh retry cached
    fresh="$(total_ir "$dir/callgrind.out.1")"
    retry="$(total_ir "$dir/callgrind.out.2")"
    cached="$(total_ir "$dir/callgrind.out.3")"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$variant" "$rep" "$fresh" "$retry" "$cached" \
        "$(less_sha "$dir/callgrind.out.1")" "$(less_sha "$dir/callgrind.out.2")" \
        "$(less_sha "$dir/callgrind.out.3")" >>"$out/results.tsv"
    printf '%-26s rep %s: Ir/request fresh %s (%ss), first retry %s (%ss), cached replay %s (%ss)\n' \
        "$variant" "$rep" $((fresh / requests)) "$t1" $((retry / requests)) "$t2" \
        $((cached / requests)) "$t3" >&2
    if [ "$t3" -ge 8 ]; then
        echo "  warning: the cached replays took ${t3}s: near the cache's 10 s maximum age," \
            "some may have gone to the store (lower -n)" >&2
    fi
}

: >"$out/results.tsv"
IFS=, read -ra names <<<"$variants"
# Interleaved: every variant once, then every variant again.
for rep in $(seq 1 "$reps"); do
    for variant in "${names[@]}"; do
        measure "$variant" "$rep"
    done
done

# The median repetition of a variant's phase (column 3: fresh, 4: first retry,
# 5: cached replay; 6 to 8: the same less SHA-256): "<Ir> <rep>".
median() {
    awk -F'\t' -v v="$1" -v col="$2" '$1 == v { print $col, $2 }' "$out/results.tsv" |
        sort -n | awk '{ a[NR] = $0 } END { print a[int((NR + 1) / 2)] }'
}

echo
echo "callgrind, Ir per request (median of $reps; $requests requests per phase," \
    "$connections connection(s), $workers tokio worker(s), $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo
table() {
    local offset="$1" annotate="$2"
    echo "| variant | fresh keys | − bare | first retry (store) | − bare | cached replay | − bare |"
    echo "|---|---|---|---|---|---|---|"
    local col ir rep_ diff row phase
    declare -A bare_ir=()
    for col in 3 4 5; do
        read -r ir _ <<<"$(median bare $((col + offset)))"
        bare_ir[$col]="${ir:-}"
    done
    for variant in "${names[@]}"; do
        row="| $variant"
        for col in 3 4 5; do
            read -r ir rep_ <<<"$(median "$variant" $((col + offset)))"
            if [ -n "${bare_ir[$col]}" ]; then
                diff=$(((ir - bare_ir[$col]) / requests))
            else
                diff="—"
            fi
            row="$row | $((ir / requests)) | $diff"
            phase="${phases[$((col - 3))]}"
            if [ "$annotate" = 1 ]; then
                callgrind_annotate --inclusive=yes --threshold=99.5 \
                    "$out/$variant-$rep_/callgrind.out.$((col - 2))" \
                    >"$out/$variant-$phase.annotate.txt" 2>&1 || true
                cp "$out/$variant-$rep_/callgrind.out.$((col - 2))" \
                    "$out/$variant-$phase.callgrind.out"
            fi
        done
        echo "$row |"
    done
}
phases=(fresh first-retry cached-replay)
table 0 1
echo
echo "The same less SHA-256's block function (valgrind runs sha2's software path, never"
echo "SHA-NI; see README.md here):"
echo
table 3 0
echo
echo "Dumps: $out/<variant>-<rep>/callgrind.out.{1,2,3} (fresh, first retry, cached"
echo "replay); the median repetition's as $out/<variant>-<phase>.callgrind.out, with"
echo "callgrind_annotate's inclusive listing beside it (.annotate.txt). Where the"
echo "instructions go: bench/http/callgrind_top.py --requests $requests \\"
echo "  --base $out/bare-fresh.callgrind.out $out/idempotent-memory-fresh.callgrind.out"
