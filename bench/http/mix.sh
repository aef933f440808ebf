#!/usr/bin/env bash
# The replay cache's A/B on a realistic mix: 90% fresh keys, 10% retries of keys from
# the last minute (wrk/fresh.lua with a retry percentage of 10), 64 connections, each store with the engine's replay
# cache on (the default) and off (BENCH_REPLAY_CACHE=off), next to the bare handler.
# Repetitions are interleaved; the table gives medians and ratios to bare's median.
#   bench/http/mix.sh [-s idempotent-sqlite-full,idempotent-postgres] [-r 5] [-d 5s] [--no-build]
#                     [-k on,off: the cache settings to run] [-b BINARY: another build's server]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
stores="idempotent-sqlite-full,idempotent-postgres"
reps=5
duration=5s
build=1
caches="on,off"
bin="$here/target/release/idempotent-http-bench"
while [ $# -gt 0 ]; do
    case "$1" in
        -s) stores="$2"; shift 2 ;;
        -r) reps="$2"; shift 2 ;;
        -d) duration="$2"; shift 2 ;;
        -k) caches="$2"; shift 2 ;;
        -b) bin="$2"; build=0; shift 2 ;;
        --no-build) build=0; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
export IDEMPOTENT_BENCH_POSTGRES_URL="${IDEMPOTENT_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export IDEMPOTENT_BENCH_MYSQL_URL="${IDEMPOTENT_BENCH_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
export IDEMPOTENT_BENCH_REDIS_URL="${IDEMPOTENT_BENCH_REDIS_URL:-redis://127.0.0.1:6379/}"
port=38080
base="http://127.0.0.1:$port"
data_dir="$here/target/bench-data"
results="$here/target/bench-results/mix-$(date +%Y%m%d-%H%M%S).tsv"
mkdir -p "$data_dir" "$(dirname "$results")"
command -v wrk >/dev/null || apt-get install -y wrk >/dev/null || { apt-get update >/dev/null && apt-get install -y wrk >/dev/null; }
[ "$build" = 1 ] && cargo build --release --locked --quiet

# Each run: "<variant> <cache on|off>".
runs=("bare on")
IFS=',' read -r -a selected <<< "$stores"
IFS=',' read -r -a settings <<< "$caches"
for store in "${selected[@]}"; do
    for cache in "${settings[@]}"; do runs+=("$store $cache"); done
done

pid=""
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null || true' EXIT

one_run() {
    local variant="$1" cache="$2" rep="$3" out
    BENCH_REPLAY_CACHE="$cache" taskset -c 0 "$bin" --variant "$variant" --addr "127.0.0.1:$port" \
        --data-dir "$data_dir" >> "$results.server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do
        curl -sf --max-time 1 "$base/stats" >/dev/null 2>&1 && break
        kill -0 "$pid" 2>/dev/null || { echo "$variant did not start (log: $results.server.log)" >&2; exit 1; }
        sleep 0.1
    done
    out="$(taskset -c 1 wrk -t1 -c64 -d"$duration" --timeout 5s --latency -s "$here/wrk/fresh.lua" \
        "$base/orders" -- "mix-$variant-$cache-$rep-$$" "$here/wrk/order.json" "" 10)"
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    pid=""
    echo "$out" | awk -v v="$variant" -v c="$cache" -v r="$rep" '
        function ms(x) { if (x ~ /us$/) return substr(x, 1, length(x) - 2) / 1000
                         if (x ~ /ms$/) return substr(x, 1, length(x) - 2) + 0
                         if (x ~ /s$/) return substr(x, 1, length(x) - 1) * 1000; return x + 0 }
        /^Requests\/sec:/ { rps = $2 }
        $1 == "99%" { p99 = ms($2) }
        /Non-2xx or 3xx responses:/ { bad += $NF }
        /Socket errors:/ { gsub(",", ""); bad += $4 + $6 + $8 + $10 }
        END { printf "%s\t%s\t%s\t%.0f\t%.2f\t%d\n", v, c, r, rps, p99, bad }' >> "$results"
}

for rep in $(seq 1 "$reps"); do
    for run in "${runs[@]}"; do
        read -r variant cache <<< "$run"
        echo "rep $rep: $variant (replay cache $cache)" >&2
        one_run "$variant" "$cache" "$rep"
    done
done

echo "| variant | replay cache | req/s (median of $reps) | × bare | p99 ms | non-2xx |"
echo "|---|---|---|---|---|---|"
awk -F'\t' '
    { key = $1 "\t" $2; n[key]++; rps[key, n[key]] = $4; p99[key, n[key]] = $5; bad[key] += $6
      if (!(key in seen)) { seen[key] = 1; order[++k] = key } }
    function median(a, key, m,   i, j, t, v) {
        for (i = 1; i <= m; i++) v[i] = a[key, i]
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
        return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2 }
    END {
        bare = median(rps, "bare\ton", n["bare\ton"])
        for (i = 1; i <= k; i++) { key = order[i]; split(key, f, "\t"); r = median(rps, key, n[key])
            printf "| %s | %s | %.0f | %.2f | %.2f | %d |\n", f[1], f[2], r, r / bare, median(p99, key, n[key]), bad[key] } }' "$results"
echo "raw: $results" >&2
