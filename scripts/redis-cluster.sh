#!/usr/bin/env bash
# A throwaway Redis Cluster on loopback for the RedisStore cluster tests: three primaries
# and one replica each (ports BASE..BASE+5, default 7000..7005), no persistence.
#
#   scripts/redis-cluster.sh start   # reuse a healthy cluster, else (re)create it
#   scripts/redis-cluster.sh stop    # shut every node down and delete its files
#   scripts/redis-cluster.sh status  # exit 0 when the cluster is healthy
#
# Then: export IDEMPOTENT_TEST_REDIS_CLUSTER_URL=redis+cluster://127.0.0.1:7000/
# Nodes keep their files under $REDIS_CLUSTER_DIR (default /tmp/idempotent-redis-cluster).
set -euo pipefail

base="${REDIS_CLUSTER_BASE_PORT:-7000}"
dir="${REDIS_CLUSTER_DIR:-/tmp/idempotent-redis-cluster}"
ports=()
for i in 0 1 2 3 4 5; do ports+=("$((base + i))"); done

cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

healthy() {
    local port
    for port in "${ports[@]}"; do
        [ "$(cli "$port" ping 2>/dev/null)" = "PONG" ] || return 1
        cli "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
    done
    # Three primaries and three replicas, none failed (the third field holds the flags).
    local nodes
    nodes="$(cli "${ports[0]}" cluster nodes)" || return 1
    [ "$(awk '$3 ~ /master/' <<<"$nodes" | wc -l)" -eq 3 ] || return 1
    [ "$(awk '$3 ~ /slave/ && $8 == "connected"' <<<"$nodes" | wc -l)" -eq 3 ] || return 1
    awk '{print $3}' <<<"$nodes" | grep -q fail && return 1
    # Each primary's replica has finished its initial sync.
    for port in "${ports[@]}"; do
        if cli "$port" info replication | grep -q '^role:master'; then
            cli "$port" info replication | grep -q '^slave0:.*state=online' || return 1
        fi
    done
}

stop() {
    local port pid
    for port in "${ports[@]}"; do
        # By pid first: a node whose clients now need a password (the failover test sets
        # one) still stops; SHUTDOWN for a node started some other way.
        pid="$(cat "$dir/$port/redis.pid" 2>/dev/null || true)"
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" || true
        else
            cli "$port" shutdown nosave >/dev/null 2>&1 || true
        fi
    done
    for port in "${ports[@]}"; do
        for _ in $(seq 1 50); do
            cli "$port" ping >/dev/null 2>&1 || break
            sleep 0.1
        done
        if cli "$port" ping >/dev/null 2>&1; then
            echo "FATAL: the Redis node on port $port does not shut down" >&2
            exit 1
        fi
    done
    rm -rf "$dir"
}

start() {
    if healthy; then
        echo "Redis Cluster on 127.0.0.1:${ports[0]}..${ports[5]} is healthy; reusing it" >&2
        return 0
    fi
    echo "Redis Cluster: (re)creating it on 127.0.0.1:${ports[0]}..${ports[5]}" >&2
    stop
    local port
    for port in "${ports[@]}"; do
        mkdir -p "$dir/$port"
        # cluster-node-timeout 2000: a killed primary is failed over within seconds (the
        # failover test waits for it), yet a loaded machine does not flap. No delay before
        # a replica's initial sync: the cluster is ready as soon as its replicas are.
        redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$port" \
            --cluster-enabled yes --cluster-config-file "$dir/$port/nodes.conf" \
            --cluster-node-timeout 2000 --save "" --appendonly no --repl-diskless-sync-delay 0 \
            --daemonize yes --logfile "$dir/$port/redis.log" --pidfile "$dir/$port/redis.pid"
    done
    for port in "${ports[@]}"; do
        for _ in $(seq 1 50); do
            [ "$(cli "$port" ping 2>/dev/null)" = "PONG" ] && break
            sleep 0.1
        done
    done
    local nodes=()
    for port in "${ports[@]}"; do nodes+=("127.0.0.1:$port"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 || {
        cat "$dir/create.log" >&2
        echo "FATAL: redis-cli --cluster create failed" >&2
        exit 1
    }
    for _ in $(seq 1 100); do
        healthy && break
        sleep 0.2
    done
    if ! healthy; then
        for port in "${ports[@]}"; do cli "$port" cluster nodes >&2 || true; done
        echo "FATAL: the Redis Cluster is not healthy 20 s after creating it" >&2
        exit 1
    fi
    echo "Redis Cluster ready: redis+cluster://127.0.0.1:${ports[0]}/" >&2
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) healthy ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
