#!/usr/bin/env bash
# What Postgres itself allows for a fresh idempotency key on this machine: pgbench, 64
# clients, each "key" two autocommitted statements — an INSERT (the claim) and an UPDATE
# (the completion), simpler than the store's own — so two commits, each waiting for its
# WAL flush. No HTTP, no engine, no handler: the ceiling for any store that commits the
# claim before the handler runs and the response after it (see bench/http/README.md). Loopback only; about 20 seconds. Needs pgbench (Debian: postgresql-client).
#
#   bench/http/postgres_ceiling.sh [POSTGRES_URL]   # default: the benchmark's URL
set -euo pipefail

url="${1:-${IDEMPOTENT_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}}"
clients="${BENCH_CONNECTIONS:-64}"
client_cpu="${BENCH_CLIENT_CPU:-1}"
table=idempotent_bench_ceiling
export PGOPTIONS="-c client_min_messages=warning"

command -v pgbench >/dev/null || { echo "pgbench is missing (apt-get install -y postgresql-client)" >&2; exit 1; }
script="$(mktemp)"
trap 'rm -f "$script"; psql "$url" -qc "DROP TABLE IF EXISTS $table" >/dev/null 2>&1 || true' EXIT

psql "$url" -q -v ON_ERROR_STOP=1 >/dev/null <<SQL
DROP TABLE IF EXISTS $table;
CREATE TABLE $table (scope text, key text, state text, body bytea, PRIMARY KEY (scope, key));
SQL
cat > "$script" <<SQL
\set k random(1, 2000000000)
INSERT INTO $table (scope, key, state) VALUES ('bench', :k::text, 'in_progress') ON CONFLICT DO NOTHING;
UPDATE $table SET state = 'completed', body = '\x7b7d' WHERE scope = 'bench' AND key = :k::text AND state = 'in_progress';
SQL

echo "Postgres: $(psql "$url" -Atc 'show server_version') (synchronous_commit $(psql "$url" -Atc 'show synchronous_commit'), commit_delay $(psql "$url" -Atc 'show commit_delay'))"
for run in 1 2 3; do
    tps="$(taskset -c "$client_cpu" pgbench "$url" -n -c "$clients" -j 1 -T 6 -f "$script" 2>/dev/null \
        | awk '/^tps/ { print $3 }')"
    printf 'run %d: %.0f keys/s (claim + completion, two commits each, %d clients)\n' "$run" "$tps" "$clients"
done
