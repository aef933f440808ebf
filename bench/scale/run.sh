#!/usr/bin/env bash
# The scale benchmark (README.md beside this file). For each SQL store and each size N it
#   1. empties the store and preloads N completed records (idempotent-scale-bench prepare:
#      a real record copied in bulk inside the database), then reports bytes on disk per
#      record (table + indexes),
#   2. serves the HTTP benchmark's app over it (pinned to one core) and runs wrk from the
#      other core: fresh keys, then replays of preloaded keys drawn at random,
# and with --sweep, for each store: preloads live records plus an expired backlog, runs
# the fresh-key load once without the sweeper and once while the sweeper purges the
# backlog, and reports the purge rate and both runs' p99. One markdown table each.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

usage() {
    cat <<EOF
usage: bench/scale/run.sh [-s STORES] [-n SIZES] [--full] [-d DURATION] [-c CONNECTIONS]
                         [-r REPEAT] [--sizes-only] [--sweep] [--sweep-only] [--backlog N]
                         [--sweep-live N] [--sweep-batch N] [--sweep-pause-ms MS]
                         [--no-build]

  -s, --stores LIST      comma-separated: sqlite, postgres, mysql (default: all three)
  -n, --sizes LIST       preloaded records per run, with k/M suffixes (default 10k,100k)
      --full             the sizes of the official run: 10k,1M,10M (10M takes about
                         5 GB per store on disk while it runs; see README.md)
  -d, --duration D       length of each wrk run, wrk syntax (default 10s)
  -c, --connections N    wrk connections (default 64)
  -r, --repeat N         wrk runs per preload, fresh and replay alternating; the table
                         shows each column's median (default 1)
      --sizes-only       preload and measure bytes per record only (no HTTP load)
      --sweep            also run the sweeper under load after the size runs
      --sweep-only       only the sweeper runs
      --backlog N        expired records the sweeper purges (default 1M)
      --sweep-live N     live records beside the backlog (default 1M)
      --sweep-batch N    the sweeper's batch (IdempotencyBuilder::sweep_batch, default 5000, the engine's)
      --sweep-pause-ms MS  its pause between batches (sweep_pause, default 0)
      --no-build         use the release binary already built

Environment: IDEMPOTENT_BENCH_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/test),
IDEMPOTENT_BENCH_MYSQL_URL (default mysql://root@127.0.0.1:3306/test), BENCH_PORT (28090),
BENCH_SERVER_CPU (0), BENCH_CLIENT_CPU (1).

Quick run: bench/scale/run.sh -n 10k -d 3s
EOF
}

stores="sqlite,postgres,mysql"
sizes="10k,100k"
duration="10s"
connections=64
repeat=1
sizes_only=0
sweep=0
size_runs=1
backlog="1M"
sweep_live="1M"
sweep_batch=5000
sweep_pause_ms=0
build=1
while [ $# -gt 0 ]; do
    case "$1" in
        -s|--stores) stores="$2"; shift 2 ;;
        -n|--sizes) sizes="$2"; shift 2 ;;
        --full) sizes="10k,1M,10M"; shift ;;
        -d|--duration) duration="$2"; shift 2 ;;
        -c|--connections) connections="$2"; shift 2 ;;
        -r|--repeat) repeat="$2"; shift 2 ;;
        --sizes-only) sizes_only=1; shift ;;
        --sweep) sweep=1; shift ;;
        --sweep-only) sweep=1; size_runs=0; shift ;;
        --backlog) backlog="$2"; shift 2 ;;
        --sweep-live) sweep_live="$2"; shift 2 ;;
        --sweep-batch) sweep_batch="$2"; shift 2 ;;
        --sweep-pause-ms) sweep_pause_ms="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

log() { printf '%s\n' "$*" >&2; }

# "10k" → 10000, "1M" → 1000000.
count_of() {
    case "$1" in
        *k|*K) echo $(( ${1%?} * 1000 )) ;;
        *m|*M) echo $(( ${1%?} * 1000000 )) ;;
        *) echo $(( $1 )) ;;
    esac
}

port="${BENCH_PORT:-28090}"
server_cpu="${BENCH_SERVER_CPU:-0}"
client_cpu="${BENCH_CLIENT_CPU:-1}"
export IDEMPOTENT_BENCH_POSTGRES_URL="${IDEMPOTENT_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export IDEMPOTENT_BENCH_MYSQL_URL="${IDEMPOTENT_BENCH_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
base="http://127.0.0.1:$port"
body="$here/../http/wrk/order.json"
scope="acct_1Pq8ZxL2mN4vR7tY"
target="$here/target"
bin="$target/release/idempotent-scale-bench"

# --- tools and build ---------------------------------------------------------------------
if [ "$sizes_only" = 0 ] && ! command -v wrk >/dev/null; then
    log "wrk is missing; installing it (apt-get install -y wrk)"
    apt-get install -y wrk >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y wrk >/dev/null; }
fi
for tool in curl taskset; do
    command -v "$tool" >/dev/null || { log "FATAL: $tool is required"; exit 1; }
done
if [ "$build" = 1 ]; then
    log "building the benchmark tool (release)"
    cargo build --release --locked --quiet
fi

data_dir="$target/bench-data"
results_dir="$target/bench-results"
mkdir -p "$data_dir" "$results_dir"
stamp="$(date +%Y%m%d-%H%M%S)"
results="$results_dir/$stamp.tsv"
sweep_results="$results_dir/$stamp-sweep.tsv"
runs="$results_dir/$stamp-runs.tsv"
server_log="$results_dir/$stamp-server.log"
wrk_log="$results_dir/$stamp-wrk.log"

server_pid=""
cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -KILL "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$data_dir"
}
trap cleanup EXIT

# --- helpers -----------------------------------------------------------------------------
# wrk's output → "rps p99_ms bad requests" (bad: non-2xx answers plus socket errors).
parse_wrk() {
    awk '
        function ms(v) {
            if (v ~ /us$/) return substr(v, 1, length(v) - 2) / 1000
            if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0
            if (v ~ /m$/) return substr(v, 1, length(v) - 1) * 60000
            if (v ~ /s$/) return substr(v, 1, length(v) - 1) * 1000
            return v + 0
        }
        /^Requests\/sec:/ { rps = $2 }
        $1 == "99%" { p99 = ms($2) }
        /Non-2xx or 3xx responses:/ { bad += $NF }
        /Socket errors:/ { gsub(",", ""); bad += $4 + $6 + $8 + $10 }
        / requests in / { total = $1 }
        END { printf "%.0f %.2f %d %d\n", rps + 0, p99 + 0, bad, total + 0 }'
}

executions() {
    curl -sf --max-time 5 "$base/stats" | sed -n 's/.*"orders":\([0-9]*\).*/\1/p'
}

# Starts the server over the prepared store; extra arguments go to `serve`.
start_server() {
    local store="$1"; shift
    echo "=== serve $store $* ($(date +%T))" >> "$server_log"
    taskset -c "$server_cpu" "$bin" serve --store "$store" --addr "127.0.0.1:$port" \
        --data-dir "$data_dir" "$@" >> "$server_log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 600); do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            wait "$server_pid" || true
            server_pid=""
            log "FATAL: the $store server exited (log: $server_log)"
            exit 1
        fi
        curl -sf --max-time 1 "$base/stats" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    log "FATAL: the $store server did not answer within 60 s (log: $server_log)"
    exit 1
}

stop_server() {
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 300); do
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
}

run_wrk() {
    local script="$1"; shift
    echo "=== $script $*" >> "$wrk_log"
    taskset -c "$client_cpu" timeout 300 wrk -t1 -c"$connections" -d"$duration" --timeout 5s \
        --latency -s "$here/wrk/$script" "$base/orders" -- "$@" | tee -a "$wrk_log"
}

# Waits until the handler counter stops moving (requests wrk left queued finish first).
wait_idle() {
    local before after
    before="$(executions)"
    for _ in $(seq 1 40); do
        sleep 0.25
        after="$(executions)"
        [ "$after" = "$before" ] && return 0
        before="$after"
    done
}

# Empties the store and preloads it; prints the tool's `result` line. Exit status 3: the
# store's server is unreachable.
prepare() {
    local store="$1" records="$2" expired="$3" status=0 output
    echo "=== prepare $store $records + $expired expired ($(date +%T))" >> "$server_log"
    output="$(taskset -c "$server_cpu" "$bin" prepare --store "$store" --records "$records" \
        --expired "$expired" --data-dir "$data_dir" 2>> "$server_log")" || status=$?
    [ "$status" = 0 ] || return "$status"
    printf '%s\n' "$output" | grep '^result '
}

# Drops the store's file, schema or database.
drop_store() {
    "$bin" drop --store "$1" --data-dir "$data_dir" 2>> "$server_log" || true
    rm -rf "$data_dir"; mkdir -p "$data_dir"
}

# field NAME from a `key=value ...` line.
field() { printf '%s\n' "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

fresh_tag() { printf '%08x' "$(( (RANDOM << 16 | RANDOM) ))"; }

# The median of one column of "rps p99_ms bad total" lines (the middle run; the lower
# middle of an even count).
median_of() {
    local column="$1"; shift
    printf '%s\n' "$@" | awk -v c="$column" '{ print $c }' | sort -g \
        | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

# "rps p99_ms bad total" lines of repeated runs → one such line: the median rps, the
# median p99, and the sums of bad answers and requests.
median_run() {
    local bad total
    bad="$(printf '%s\n' "$@" | awk '{ s += $3 } END { print s + 0 }')"
    total="$(printf '%s\n' "$@" | awk '{ s += $4 } END { print s + 0 }')"
    echo "$(median_of 1 "$@") $(median_of 2 "$@") $bad $total"
}

declare -A skipped=()

# --- size runs ---------------------------------------------------------------------------
IFS=',' read -r -a store_list <<< "$stores"
IFS=',' read -r -a size_list <<< "$sizes"
printf 'store\trecords\tload_s\tbytes_per_record\ttable_bytes\tindex_bytes\tfresh_rps\tfresh_p99_ms\tfresh_bad\treplay_rps\treplay_p99_ms\treplay_bad\treplay_execs\n' > "$results"
printf 'store\trecords\trun\tfresh (rps p99_ms bad total)\treplay (rps p99_ms bad total)\n' > "$runs"
if [ "$size_runs" = 1 ]; then
    for store in "${store_list[@]}"; do
        for size in "${size_list[@]}"; do
            records="$(count_of "$size")"
            log "$store: preloading $records records ($(date +%T))"
            status=0
            result="$(prepare "$store" "$records" 0)" || status=$?
            if [ "$status" = 3 ]; then
                skipped[$store]="$(grep "^skipped: $store" "$server_log" | tail -n 1)"
                log "  ${skipped[$store]}"
                break
            elif [ "$status" != 0 ]; then
                log "FATAL: preloading $store failed (log: $server_log)"; exit 1
            fi
            log "  $result"
            fresh="- - - -"; replay="- - - -"; replay_execs="-"
            if [ "$sizes_only" = 0 ]; then
                start_server "$store"
                fresh_runs=(); replay_runs=(); replay_execs=0
                for run in $(seq 1 "$repeat"); do
                    fresh_runs+=("$(run_wrk fresh.lua "$(fresh_tag)" "$body" "$scope" | parse_wrk)")
                    wait_idle
                    before="$(executions)"
                    replay_runs+=("$(run_wrk replay.lua "$records" "$body" "$scope" "$RANDOM" | parse_wrk)")
                    wait_idle
                    replay_execs=$(( replay_execs + $(executions) - before ))
                    log "  run $run (rps p99_ms bad total): fresh ${fresh_runs[-1]}; replay ${replay_runs[-1]}"
                    printf '%s\t%s\t%s\t%s\t%s\n' "$store" "$records" "$run" "${fresh_runs[-1]}" \
                        "${replay_runs[-1]}" >> "$runs"
                done
                stop_server
                fresh="$(median_run "${fresh_runs[@]}")"
                replay="$(median_run "${replay_runs[@]}")"
                log "  median of $repeat (rps p99_ms bad total): fresh $fresh; replay $replay; handler runs during replays: $replay_execs"
            fi
            read -r f_rps f_p99 f_bad _ <<< "$fresh"
            read -r r_rps r_p99 r_bad _ <<< "$replay"
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$store" "$records" \
                "$(field load_seconds "$result")" "$(field bytes_per_record "$result")" \
                "$(field table_bytes "$result")" "$(field index_bytes "$result")" \
                "$f_rps" "$f_p99" "$f_bad" "$r_rps" "$r_p99" "$r_bad" "$replay_execs" >> "$results"
        done
        # Frees the disk before the next store (10M records take gigabytes).
        drop_store "$store"
    done
fi

# --- the sweeper under load --------------------------------------------------------------
printf 'store\tlive\tbacklog\tbatch\tpause_ms\tpurge_rows_per_s\tpurge_s\tpurge_left\tbase_rps\tbase_p99_ms\tsweep_rps\tsweep_p99_ms\tbad\n' > "$sweep_results"
if [ "$sweep" = 1 ]; then
    live="$(count_of "$sweep_live")"
    expired="$(count_of "$backlog")"
    for store in "${store_list[@]}"; do
        [ -z "${skipped[$store]:-}" ] || continue
        log "$store: preloading $live live + $expired expired records ($(date +%T))"
        status=0
        result="$(prepare "$store" "$live" "$expired")" || status=$?
        if [ "$status" = 3 ]; then
            skipped[$store]="$(grep "^skipped: $store" "$server_log" | tail -n 1)"
            log "  ${skipped[$store]}"
            continue
        elif [ "$status" != 0 ]; then
            log "FATAL: preloading $store failed (log: $server_log)"; exit 1
        fi
        log "  $result"
        start_server "$store"
        base_run="$(run_wrk fresh.lua "$(fresh_tag)" "$body" "$scope" | parse_wrk)"
        wait_idle
        stop_server
        start_server "$store" --sweep-batch "$sweep_batch" --sweep-pause-ms "$sweep_pause_ms"
        sweep_run="$(run_wrk fresh.lua "$(fresh_tag)" "$body" "$scope" | parse_wrk)"
        wait_idle
        stop_server
        purge="$(grep '^purge: \(done\|unfinished\)' "$server_log" | tail -n 1)"
        log "  without sweeping: $base_run; sweeping: $sweep_run; $purge"
        read -r b_rps b_p99 b_bad _ <<< "$base_run"
        read -r s_rps s_p99 s_bad _ <<< "$sweep_run"
        left="$(field left "$purge")"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$store" "$live" "$expired" \
            "$sweep_batch" "$sweep_pause_ms" "$(field rows_per_s "$purge")" \
            "$(field seconds "$purge")" "${left:-0}" "$b_rps" "$b_p99" "$s_rps" "$s_p99" \
            "$(( b_bad + s_bad ))" >> "$sweep_results"
        drop_store "$store"
    done
fi

# --- tables ------------------------------------------------------------------------------
echo
echo "Scale benchmark, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs; wrk -t1 -c$connections -d$duration per run, median of $repeat per cell"
if [ "$size_runs" = 1 ]; then
    echo
    echo "| store | records | load s | bytes/record | table MB | index MB | fresh req/s | fresh p99 ms | replay req/s | replay p99 ms | bad | handler runs in replays |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    tail -n +2 "$results" | awk -F'\t' '{
        bad = ($9 == "-" ? "-" : $9 + $12)
        printf "| %s | %s | %s | %s | %.1f | %.1f | %s | %s | %s | %s | %s | %s |\n",
            $1, $2, $3, $4, $5 / 1e6, $6 / 1e6, $7, $8, $10, $11, bad, $13 }'
fi
if [ "$sweep" = 1 ]; then
    echo
    echo "| store | live | backlog | batch | pause ms | purge rows/s | purge s | left | fresh req/s, no sweep | p99 ms, no sweep | fresh req/s, sweeping | p99 ms, sweeping | p99 ratio | bad |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    tail -n +2 "$sweep_results" | awk -F'\t' '{
        ratio = ($10 > 0 ? sprintf("%.2f", $12 / $10) : "-")
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
            $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, ratio, $13 }'
fi
for store in "${!skipped[@]}"; do
    echo
    echo "$store skipped: ${skipped[$store]}"
done
echo
echo "Raw rows: $results (each run: $runs)${sweep:+ and $sweep_results}; server log: $server_log"
