#!/usr/bin/env bash
# The HTTP load benchmark (README.md beside this file). For each variant and repetition it
# starts the server on an empty store pinned to one core, and from the other core runs
#   1. wrk with a fresh Idempotency-Key per request (fresh-key run),
#   2. wrk replaying keys the fresh run completed (replay run),
#   3. 50 concurrent requests with one key against the 100 ms handler (executions counted),
# then prints the medians over the repetitions as one markdown table with ratios vs the
# bare handler and vs the nearest peer. Loopback only; every step is bounded in time.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

ALL_VARIANTS="bare,fingerprint-only,floor-memory,idempotent-memory,axum-idempotent,idempotent-sqlite-normal,rustango-sqlite-normal,idempotent-sqlite-full,rustango-sqlite-full,idempotent-postgres,rustango-postgres,idempotent-mysql,idempotent-redis"

usage() {
    cat <<EOF
usage: bench/http/run.sh [-v VARIANTS] [-r REPS] [-d DURATION] [-c CONNECTIONS]
                        [-m MALLOC] [--no-build]

  -v, --variants LIST    comma-separated variants (default: all):
                         ${ALL_VARIANTS//,/, }
  -r, --reps N           repetitions; the table shows medians (default 3)
  -d, --duration D       length of each wrk run, wrk syntax (default 10s)
  -c, --connections N    wrk connections (default 64)
  -m, --malloc M         the allocator every server runs with (default glibc):
                         glibc, glibc-tcache (glibc with GLIBC_TUNABLES
                         glibc.malloc.tcache_count=1000), mimalloc, jemalloc
                         (LD_PRELOAD of Debian's libmimalloc2.0 / libjemalloc2,
                         installed when missing)
      --no-build         use the release binaries already built

Environment (each flag has one too: BENCH_VARIANTS, BENCH_REPS, BENCH_DURATION,
BENCH_CONNECTIONS, BENCH_MALLOC):
  IDEMPOTENT_BENCH_POSTGRES_URL  default postgres://postgres@127.0.0.1:5432/test
  IDEMPOTENT_BENCH_MYSQL_URL     default mysql://root@127.0.0.1:3306/test
  IDEMPOTENT_BENCH_REDIS_URL     default redis://127.0.0.1:6379/
  BENCH_PORT (38080), BENCH_SERVER_CPU (0), BENCH_CLIENT_CPU (1)
  BENCH_REPLAY_KEYS (1000): how many completed keys the replay run cycles through

Quick run: bench/http/run.sh -r 1 -d 3s
EOF
}

variants="${BENCH_VARIANTS:-$ALL_VARIANTS}"
reps="${BENCH_REPS:-3}"
duration="${BENCH_DURATION:-10s}"
connections="${BENCH_CONNECTIONS:-64}"
malloc="${BENCH_MALLOC:-glibc}"
build=1
while [ $# -gt 0 ]; do
    case "$1" in
        -v|--variants) variants="$2"; shift 2 ;;
        -r|--reps) reps="$2"; shift 2 ;;
        -d|--duration) duration="$2"; shift 2 ;;
        -c|--connections) connections="$2"; shift 2 ;;
        -m|--malloc) malloc="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

port="${BENCH_PORT:-38080}"
server_cpu="${BENCH_SERVER_CPU:-0}"
client_cpu="${BENCH_CLIENT_CPU:-1}"
replay_keys="${BENCH_REPLAY_KEYS:-1000}"
export IDEMPOTENT_BENCH_POSTGRES_URL="${IDEMPOTENT_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export IDEMPOTENT_BENCH_MYSQL_URL="${IDEMPOTENT_BENCH_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
export IDEMPOTENT_BENCH_REDIS_URL="${IDEMPOTENT_BENCH_REDIS_URL:-redis://127.0.0.1:6379/}"
base="http://127.0.0.1:$port"
clock_ticks="$(getconf CLK_TCK)"
body="$here/wrk/order.json"
target="$here/target"

# The allocator: the same for every variant (peers included), as an environment for the
# server. Under glibc's default, the cost of a request depends on how the heap happens to
# be laid out (see README.md here); the others show the layers without that.
server_env=()
case "$malloc" in
    glibc) ;;
    glibc-tcache) server_env=("GLIBC_TUNABLES=glibc.malloc.tcache_count=1000") ;;
    mimalloc|jemalloc)
        package="libmimalloc2.0"; library="libmimalloc.so.2"
        if [ "$malloc" = jemalloc ]; then package="libjemalloc2"; library="libjemalloc.so.2"; fi
        path="$(ldconfig -p | awk -v l="$library" '$1 == l { print $NF; exit }')"
        if [ -z "$path" ]; then
            echo "$library is missing; installing it (apt-get install -y $package)" >&2
            apt-get install -y "$package" >/dev/null 2>&1 \
                || { apt-get update >/dev/null && apt-get install -y "$package" >/dev/null; }
            path="$(ldconfig -p | awk -v l="$library" '$1 == l { print $NF; exit }')"
        fi
        [ -n "$path" ] || { echo "cannot find $library" >&2; exit 1; }
        server_env=("LD_PRELOAD=$path")
        ;;
    *) echo "unknown allocator: $malloc (glibc, glibc-tcache, mimalloc, jemalloc)" >&2; exit 2 ;;
esac

IFS=',' read -r -a selected <<< "$variants"
for v in "${selected[@]}"; do
    case ",$ALL_VARIANTS," in
        *",$v,"*) ;;
        *) echo "unknown variant: $v (known: $ALL_VARIANTS)" >&2; exit 2 ;;
    esac
done

log() { printf '%s\n' "$*" >&2; }

# --- tools -------------------------------------------------------------------------------
if ! command -v wrk >/dev/null; then
    log "wrk is missing; installing it (apt-get install -y wrk)"
    apt-get install -y wrk >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y wrk >/dev/null; }
fi
for tool in wrk curl taskset ss; do
    command -v "$tool" >/dev/null || { log "FATAL: $tool is required"; exit 1; }
done

# --- build -------------------------------------------------------------------------------
uses_rustango=0
uses_ours=0
for v in "${selected[@]}"; do
    case "$v" in rustango-*) uses_rustango=1 ;; *) uses_ours=1 ;; esac
done
if [ "$build" = 1 ]; then
    if [ "$uses_ours" = 1 ]; then
        log "building the benchmark server (release)"
        cargo build --release --locked --quiet
    fi
    if [ "$uses_rustango" = 1 ]; then
        log "building the rustango peer (release)"
        CARGO_TARGET_DIR="$target" cargo build --release --locked --quiet \
            --manifest-path rustango-peer/Cargo.toml
    fi
fi

data_dir="$target/bench-data"
results_dir="$target/bench-results"
mkdir -p "$data_dir" "$results_dir"
stamp="$(date +%Y%m%d-%H%M%S)"
results="$results_dir/$stamp.tsv"
server_log="$results_dir/$stamp-server.log"
wrk_log="$results_dir/$stamp-wrk.log"
printf 'variant\trep\tfresh_rps\tfresh_p99_ms\tfresh_bad\treplay_rps\treplay_p99_ms\treplay_bad\treplay_execs\tdupe_execs\tdupe_codes\tfresh_writes\treplay_writes\tfresh_cpu_us\treplay_cpu_us\tfresh_steal_pct\treplay_steal_pct\n' > "$results"

server_pid=""
cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -KILL "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$data_dir"
}
trap cleanup EXIT

# --- helpers -----------------------------------------------------------------------------
binary_for() {
    case "$1" in
        rustango-*) echo "$target/release/rustango-peer" ;;
        *) echo "$target/release/idempotent-http-bench" ;;
    esac
}

# The peer a variant is compared with (empty: none).
peer_for() {
    case "$1" in
        idempotent-memory) echo axum-idempotent ;;
        idempotent-sqlite-normal) echo rustango-sqlite-normal ;;
        idempotent-sqlite-full) echo rustango-sqlite-full ;;
        idempotent-postgres) echo rustango-postgres ;;
        *) echo "" ;;
    esac
}

# The port of the store server a variant talks to over TCP (empty: none).
store_port_for() {
    local url default
    case "$1" in
        *-postgres) url="$IDEMPOTENT_BENCH_POSTGRES_URL"; default=5432 ;;
        *-mysql) url="$IDEMPOTENT_BENCH_MYSQL_URL"; default=3306 ;;
        *-redis) url="$IDEMPOTENT_BENCH_REDIS_URL"; default=6379 ;;
        *) echo ""; return ;;
    esac
    local hostport="${url#*://}"
    hostport="${hostport#*@}"
    hostport="${hostport%%/*}"
    case "$hostport" in
        *:*) echo "${hostport##*:}" ;;
        *) echo "$default" ;;
    esac
}

# Round trips to the store so far, counted so that a run's delta divided by its requests
# gives round trips per request:
# - Postgres: data segments the server process sent to the store's port, summed over its
#   open connections. sqlx writes each statement (with its parameters) at once and flushes
#   its on-release ping (a Sync) separately, so this counts statements plus pings.
# - MySQL: the same count on its port. sqlx sends each prepared statement's execution
#   (COM_STMT_EXECUTE) in one write and pings (COM_PING) on release, so again statements
#   plus pings (plus a COM_STMT_PREPARE the first time a connection runs a statement).
# - Redis: script calls (EVALSHA, EVAL and their read-only forms, from INFO commandstats;
#   needs redis-cli): every RedisStore operation is one script call in one round trip.
#   Counting at the server is needed because the client multiplexes one connection and
#   batches concurrent commands into one write. It counts every client of that Redis, so
#   other traffic on it inflates the figure.
store_round_trips() {
    local variant="$1" pid="$2" store_port="$3"
    case "$variant" in
        *-redis)
            if command -v redis-cli >/dev/null; then
                redis-cli -u "$IDEMPOTENT_BENCH_REDIS_URL" info commandstats 2>/dev/null \
                    | awk -F'[:=,]' '/^cmdstat_(evalsha|eval|evalsha_ro|eval_ro)[:]/ { n += $3 }
                        END { print n + 0 }'
            fi
            return ;;
    esac
    ss -tinpH state established "( dport = :$store_port )" 2>/dev/null | awk -v pid="pid=$pid," '
        index($0, pid) { mine = 1 }
        mine && match($0, /data_segs_out:[0-9]+/) {
            sum += substr($0, RSTART + 14, RLENGTH - 14); mine = 0
        }
        END { print sum + 0 }'
}

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
        END { printf "%s %s %d %d\n", rps + 0, p99 + 0, bad, total + 0 }'
}

# The server's CPU time so far (user + system, all its threads, dead ones included), in
# microseconds. The kernel leaves out time the hypervisor stole (paravirtual steal-time
# accounting), so per request it moves less with the rest of the host than the
# throughput does (not nothing: heavy steal still raises it).
server_cpu_us() {
    sed 's/^.*) //' "/proc/$server_pid/stat" \
        | awk -v hz="$clock_ticks" '{ printf "%.0f\n", ($12 + $13) * 1000000 / hz }'
}
# Clock ticks of both CPUs so far: "stolen total" (steal is the time the hypervisor ran
# something else while this machine wanted the CPU).
# (user .. steal: the guest columns after steal are already counted in user and nice.)
host_ticks() { awk '$1 == "cpu" { t = 0; for (i = 2; i <= 9; i++) t += $i; print $9, t; exit }' /proc/stat; }
# Percent of the CPUs' time stolen between two host_ticks readings.
steal_pct() {
    awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " ")
        t = y[2] - x[2]; if (t > 0) printf "%.1f", 100 * (y[1] - x[1]) / t; else print "-" }'
}
# Microseconds of server CPU per request: $1 and $2 readings of server_cpu_us, $3 requests.
per_request() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { if (n > 0) printf "%.2f", (b - a) / n; else print "-" }'; }

stats_field() {
    curl -sf --max-time 5 "$base/stats" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"
}

start_server() {
    local variant="$1" bin
    bin="$(binary_for "$variant")"
    echo "=== $variant ($(date +%T))" >> "$server_log"
    env "${server_env[@]}" taskset -c "$server_cpu" "$bin" --variant "$variant" --addr "127.0.0.1:$port" \
        --data-dir "$data_dir" >> "$server_log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 300); do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            local status=0
            wait "$server_pid" || status=$?
            server_pid=""
            return "$status"
        fi
        curl -sf --max-time 1 "$base/stats" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    log "FATAL: $variant did not answer within 30 s (log: $server_log)"
    exit 1
}

stop_server() {
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
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
    taskset -c "$client_cpu" timeout 120 wrk -t1 -c"$connections" -d"$duration" --timeout 5s \
        --latency -s "$here/wrk/$script" "$base/orders" -- "$@" | tee -a "$wrk_log"
}

# Waits until the handler counter stops moving: requests a run left in the server's queue
# (a stopped wrk leaves up to $connections behind; detached handlers finish anyway) are
# done before the next run starts and counts. Bounded at 10 s.
wait_idle() {
    local before after
    before="$(stats_field "$1")"
    for _ in $(seq 1 40); do
        sleep 0.25
        after="$(stats_field "$1")"
        [ "$after" = "$before" ] && return 0
        before="$after"
    done
}

declare -A skipped=()

# One repetition of one variant: appends a row to $results.
measure() {
    local variant="$1" rep="$2" status=0
    start_server "$variant" || status=$?
    if [ "$status" != 0 ]; then
        if [ "$status" = 3 ]; then
            local reason
            reason="$(grep '^skipped:' "$server_log" | tail -n 1)"
            log "  $reason"
            skipped[$variant]="$reason"
            return 0
        fi
        log "FATAL: $variant exited with status $status (log: $server_log)"
        exit 1
    fi

    # axum-idempotent caches nothing outside a session: take its cookie (the other
    # servers have no /session and set none).
    local cookie
    cookie="$(curl -s --max-time 5 -D - -o /dev/null -X POST "$base/session" \
        | sed -n 's/^[Ss]et-[Cc]ookie: \(session=[^;]*\).*/\1/p' | tr -d '\r')"

    local prefix="r$rep-$$-$variant" store_port writes_before="" writes_after=""
    store_port="$(store_port_for "$variant")"

    local fresh orders_before
    orders_before="$(stats_field orders)"
    [ -n "$store_port" ] && writes_before="$(store_round_trips "$variant" "$server_pid" "$store_port")"
    local cpu_before cpu_after host_before
    cpu_before="$(server_cpu_us)"; host_before="$(host_ticks)"
    fresh="$(run_wrk fresh.lua "$prefix" "$body" "$cookie" | parse_wrk)"
    cpu_after="$(server_cpu_us)"
    local fresh_steal
    fresh_steal="$(steal_pct "$host_before" "$(host_ticks)")"
    read -r fresh_rps fresh_p99 fresh_bad fresh_total <<< "$fresh"
    local fresh_cpu
    fresh_cpu="$(per_request "$cpu_before" "$cpu_after" "$fresh_total")"
    wait_idle orders
    # Per fresh request: every one of them runs the handler once, including those wrk
    # left running when it stopped, whose store calls are counted too.
    local fresh_writes="-"
    if [ -n "$writes_before" ]; then
        writes_after="$(store_round_trips "$variant" "$server_pid" "$store_port")"
        fresh_writes="$(awk -v d=$((writes_after - writes_before)) \
            -v n=$(( $(stats_field orders) - orders_before )) \
            'BEGIN { printf "%.2f", n ? d / n : 0 }')"
    fi

    # Keys the fresh run surely completed: its first ones (only the last $connections
    # can still be running when wrk stops).
    local keys=$(( fresh_total - 2 * connections - 1 ))
    [ "$keys" -gt "$replay_keys" ] && keys="$replay_keys"
    [ "$keys" -lt 1 ] && keys=1
    local execs_before
    execs_before="$(stats_field orders)"
    [ -n "$store_port" ] && writes_before="$(store_round_trips "$variant" "$server_pid" "$store_port")"
    local replay
    cpu_before="$(server_cpu_us)"; host_before="$(host_ticks)"
    replay="$(run_wrk replay.lua "$prefix" "$body" "$cookie" "$keys" | parse_wrk)"
    cpu_after="$(server_cpu_us)"
    local replay_steal
    replay_steal="$(steal_pct "$host_before" "$(host_ticks)")"
    read -r replay_rps replay_p99 replay_bad replay_total <<< "$replay"
    local replay_cpu
    replay_cpu="$(per_request "$cpu_before" "$cpu_after" "$replay_total")"
    local replay_writes="-"
    if [ -n "$writes_before" ]; then
        writes_after="$(store_round_trips "$variant" "$server_pid" "$store_port")"
        replay_writes="$(awk -v d=$((writes_after - writes_before)) -v n="$replay_total" \
            'BEGIN { printf "%.2f", n ? d / n : 0 }')"
    fi
    local replay_execs=$(( $(stats_field orders) - execs_before ))

    # 50 concurrent duplicates of one key against the 100 ms handler.
    wait_idle orders
    local slow_before urls=() codes dupe_execs
    slow_before="$(stats_field slow_orders)"
    for _ in $(seq 1 50); do urls+=(-o /dev/null "$base/orders/slow"); done
    codes="$(taskset -c "$client_cpu" curl -s --no-progress-meter --max-time 30 -Z --parallel-immediate \
        --parallel-max 50 -H 'Content-Type: application/json' -H 'Authorization: Bearer bench' \
        -H "Idempotency-Key: $prefix-dupe" ${cookie:+-H "Cookie: $cookie"} \
        --data-binary "@$body" -w '%{http_code}\n' "${urls[@]}" 2>/dev/null \
        | sort | uniq -c | awk '{ printf "%s%s×%s", sep, $2, $1; sep = " " }')"
    wait_idle slow_orders
    dupe_execs=$(( $(stats_field slow_orders) - slow_before ))

    stop_server
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$variant" "$rep" \
        "$fresh_rps" "$fresh_p99" "$fresh_bad" "$replay_rps" "$replay_p99" "$replay_bad" \
        "$replay_execs" "$dupe_execs" "$codes" "$fresh_writes" "$replay_writes" \
        "$fresh_cpu" "$replay_cpu" "$fresh_steal" "$replay_steal" >> "$results"
    log "  $variant #$rep: fresh $fresh_rps req/s p99 ${fresh_p99} ms; replay $replay_rps req/s p99 ${replay_p99} ms; CPU per request ${fresh_cpu} / ${replay_cpu} µs; steal ${fresh_steal}% / ${replay_steal}%; dupes: $dupe_execs execs ($codes)"
}

# --- run ---------------------------------------------------------------------------------
log "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1); load: $(cut -d' ' -f1-3 /proc/loadavg)"
log "variants: ${selected[*]}; $reps repetition(s) of wrk -t1 -c$connections -d$duration"
for rep in $(seq 1 "$reps"); do
    for variant in "${selected[@]}"; do
        [ -n "${skipped[$variant]:-}" ] && continue
        measure "$variant" "$rep"
    done
done
log "raw results: $results (wrk output: $wrk_log); load after: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- table -------------------------------------------------------------------------------
# The median of column $2 over variant $1's rows.
median() {
    awk -F'\t' -v v="$1" -v c="$2" 'NR > 1 && $1 == v && $c != "-" { print $c }' "$results" \
        | sort -g | awk '{ a[NR] = $1 } END {
            if (NR == 0) { print "-"; exit }
            if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
# The most frequent value of column $2 over variant $1's rows.
mode() {
    awk -F'\t' -v v="$1" -v c="$2" 'NR > 1 && $1 == v { print $c }' "$results" \
        | sort | uniq -c | sort -rn | head -n 1 | sed 's/^ *[0-9]* //'
}
thousands() { awk -v n="$1" 'BEGIN { s = sprintf("%.0f", n); r = ""
    while (length(s) > 3) { r = "," substr(s, length(s) - 2) r; s = substr(s, 1, length(s) - 3) }
    print s r }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f×", a / b }'; }
us() { awk -v v="$1" 'BEGIN { if (v == "-") print "-"; else printf "%.1f µs", v }'; }
ms() { awk -v v="$1" 'BEGIN { if (v < 10) printf "%.2f ms", v; else if (v < 100) printf "%.1f ms", v; else printf "%.0f ms", v }'; }

bare_fresh="$(median bare 3)"; bare_replay="$(median bare 6)"; bare_p99="$(median bare 4)"
bare_fresh_cpu="$(median bare 14)"; bare_replay_cpu="$(median bare 15)"
echo
echo "wrk -t1 -c$connections -d$duration, medians of $reps repetition(s); server on CPU $server_cpu, wrk on CPU $client_cpu; allocator: $malloc"
echo
echo "| variant | fresh key req/s (× bare) | replay req/s (× bare) | fresh p99 (× bare) | replay p99 | execs per 50 concurrent dupes | fresh × peer | replay × peer | store round trips per request (fresh / replay) | server CPU per request, fresh / replay (bare's ÷ this) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for variant in "${selected[@]}"; do
    if [ -n "${skipped[$variant]:-}" ]; then
        echo "| $variant | skipped: ${skipped[$variant]#"skipped: $variant: "} | | | | | | | | |"
        continue
    fi
    fresh="$(median "$variant" 3)"; replay="$(median "$variant" 6)"
    p99="$(median "$variant" 4)"; replay_p99="$(median "$variant" 7)"
    peer="$(peer_for "$variant")"
    vs_fresh="—"; vs_replay="—"
    if [ -n "$peer" ] && [ -z "${skipped[$peer]:-}" ] && grep -q "^$peer	" "$results"; then
        vs_fresh="$(ratio "$fresh" "$(median "$peer" 3)") $peer"
        vs_replay="$(ratio "$replay" "$(median "$peer" 6)") $peer"
    fi
    writes="—"
    [ -n "$(store_port_for "$variant")" ] && writes="$(median "$variant" 12) / $(median "$variant" 13)"
    fresh_cpu="$(median "$variant" 14)"; replay_cpu="$(median "$variant" 15)"
    cpu="$(us "$fresh_cpu") / $(us "$replay_cpu") ($(ratio "$bare_fresh_cpu" "$fresh_cpu") / $(ratio "$bare_replay_cpu" "$replay_cpu"))"
    echo "| $variant | $(thousands "$fresh") ($(ratio "$fresh" "$bare_fresh")) | $(thousands "$replay") ($(ratio "$replay" "$bare_replay")) | $(ms "$p99") ($(ratio "$p99" "$bare_p99")) | $(ms "$replay_p99") | $(median "$variant" 10) ($(mode "$variant" 11)) | $vs_fresh | $vs_replay | $writes | $cpu |"
done

# The memory store against the floor: how much of what any correct in-process layer must
# spend (floor_app.rs) the engine spends on top.
if grep -q "^floor-memory	" "$results" && grep -q "^idempotent-memory	" "$results"; then
    echo
    echo "idempotent-memory against floor-memory (the least a correct in-process layer does): fresh $(ratio "$(median idempotent-memory 3)" "$(median floor-memory 3)"), replay $(ratio "$(median idempotent-memory 6)" "$(median floor-memory 6)"); in server CPU per request (floor's ÷ memory's): fresh $(ratio "$(median floor-memory 14)" "$(median idempotent-memory 14)"), replay $(ratio "$(median floor-memory 15)" "$(median idempotent-memory 15)")"
fi

# How much of the machine the hypervisor took while the load ran: the noise behind the
# repetitions' spread (throughput moves with it; CPU per request far less).
echo
awk -F'\t' 'NR > 1 { for (c = 16; c <= 17; c++) if ($c != "-" && $c != "") print $c }' "$results" \
    | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit
        printf "CPU time stolen by the hypervisor during the load runs: median %.1f%%, max %.1f%% (of both CPUs)\n",
            (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[NR] }'

# Anything that makes a row suspect: error answers in the load runs, or handler runs
# during the replay run (a replay that was not one).
notes="$(awk -F'\t' 'NR > 1 && ($5 > 0 || $8 > 0 || ($9 > 0 && $1 != "bare" && $1 != "fingerprint-only")) {
    printf "- %s #%s: %d bad answers in the fresh run, %d in the replay run, %d handler runs during the replay run\n", $1, $2, $5, $8, $9 }' "$results")"
if [ -n "$notes" ]; then
    echo
    echo "Suspect runs (bad answers: non-2xx or socket errors, see the wrk log; handler runs during replays):"
    echo "$notes"
fi
