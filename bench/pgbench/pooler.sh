#!/usr/bin/env bash
# What PgBouncer in transaction mode costs the raw-SQL floor itself, with no
# framework: the same pgbench scripts on the same number of server
# connections, once direct and once through PgBouncer, in alternating rounds
# (direct, pooled, pooled, direct, ...) on a fresh table each, so the ratio
# pooled ÷ direct is the most a client of this server and pooler can reach.
#
#   heartbeat:     claim BATCH rows (50), then complete them (two autocommit
#                  statements)
#   transactional: claim 1 row, then BEGIN; lock it; complete it; COMMIT
#
# Direct runs use SERVER clients; pooled runs the same SERVER, and CLIENTS
# clients on SERVER server connections (PgBouncer queues the rest). Direct
# runs go in the simple protocol as the pooled ones must, and once prepared,
# as a direct sqlx pool sends them.
#
#   DATABASE_URL=postgres://... bash bench/pgbench/pooler.sh
#
# DBWORKER=target/release/dbworker uses a built CLI instead of `cargo run`.
# Needs pgbench and pgbouncer (PGBOUNCER, else on PATH or /usr/sbin), a
# scratch database (it drops and creates the table cmp_pool), and the server
# on TCP at 127.0.0.1 (PgBouncer connects there; SERVER_HOST to change).
# PgBouncer refuses to run as root: as root it runs as the user postgres. It
# logs in with no password (auth_type = any), so the server must trust
# connections from 127.0.0.1.
SERVER=${SERVER:-20}
CLIENTS=${CLIENTS:-64}
ROUNDS=${ROUNDS:-3}
TX_JOBS=${TX_JOBS:-20000}
BATCH=${BATCH:-50}
SHAPES=${SHAPES:-heartbeat transactional}
source "$(dirname "$0")/common.sh"
PGBOUNCER=${PGBOUNCER:-$(command -v pgbouncer || echo /usr/sbin/pgbouncer)}
t=cmp_pool

database=$(psql_ -Atc "SELECT current_database()")
server_port=$(psql_ -Atc "SELECT current_setting('port')")
port=$((20000 + RANDOM % 20000))
cat > "$work/pgbouncer.ini" <<INI
[databases]
$database = host=${SERVER_HOST:-127.0.0.1} port=$server_port user=$(psql_ -Atc "SELECT current_user") dbname=$database

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = $SERVER
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
server_reset_query =
logfile = $work/pgbouncer.log
pidfile = $work/pgbouncer.pid
INI
if [ "$(id -u)" = 0 ]; then
    chown -R postgres "$work"
    runuser -u postgres -- "$PGBOUNCER" -d "$work/pgbouncer.ini"
else
    "$PGBOUNCER" -d "$work/pgbouncer.ini"
fi
trap 'kill "$(cat "$work/pgbouncer.pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$work"' EXIT
pooled="postgres://postgres@127.0.0.1:$port/$database"
# Through this PgBouncer, not whatever else may listen on the port.
for _ in $(seq 50); do
    [ "$(env -u PGOPTIONS psql "$pooled" -Atc "SHOW port" 2>/dev/null)" = "$server_port" ] && break
    sleep 0.1
done
[ -s "$work/pgbouncer.pid" ] && [ "$(env -u PGOPTIONS psql "$pooled" -Atc "SHOW port")" = "$server_port" ] || {
    echo "PgBouncer did not start on port $port: $(cat "$work/pgbouncer.log" 2>/dev/null)" >&2
    exit 1
}

# Claims mark their rows with the pgbench client, so a completion by id range
# touches its own rows only; `:client_id::text` reads the same in both
# protocols (a variable inside quotes would not).
claim() { # rows
    echo "WITH c AS (UPDATE $t SET state = 'processing', started_at = now(), last_heartbeat_at = now(), worker_hostname = :client_id::text WHERE id IN (SELECT id FROM $t WHERE state IN ('queued', 'errored') AND (process_after IS NULL OR process_after <= now()) ORDER BY id FOR UPDATE SKIP LOCKED LIMIT $1) RETURNING id) SELECT coalesce(min(id), 0) AS lo, coalesce(max(id), -1) AS hi FROM c \\gset"
}
mine="id BETWEEN :lo AND :hi AND state = 'processing' AND worker_hostname = :client_id::text"
{
    claim "$BATCH"
    echo "UPDATE $t SET state = 'completed', finished_at = now() WHERE $mine;"
} > "$work/heartbeat.sql"
{
    claim 1
    echo "BEGIN;"
    echo "SELECT id FROM $t WHERE $mine FOR KEY SHARE;"
    echo "UPDATE $t SET state = 'completed', finished_at = now() WHERE $mine;"
    echo "COMMIT;"
} > "$work/transactional.sql"

fresh() {
    psql_ -c "DROP TABLE IF EXISTS $t"
    migration --table "$t" | psql_ >/dev/null
    psql_ -c "INSERT INTO $t (state) SELECT 'queued' FROM generate_series(1, $ROWS)"
    psql_ -c "VACUUM ANALYZE $t" -c CHECKPOINT
}
run() { # shape, label, url, clients, protocol; prints jobs/s
    fresh
    local per=$BATCH tx=$((ROWS * 3 / (4 * BATCH * $4)))
    [ "$1" = transactional ] && per=1 tx=$((TX_JOBS / $4))
    [ "$tx" -ge 1 ] || { echo "too few rows for $4 clients: raise ROWS or TX_JOBS" >&2; exit 1; }
    local tps
    tps=$(env -u PGOPTIONS "$PGBENCH" "$3" -n -c "$4" -j 2 -t "$tx" -M "$5" -f "$work/$1.sql" |
        sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    [ -n "$tps" ] || { echo "pgbench failed: $1, $2" >&2; exit 1; }
    # jobs/s counts every claim as full: the table holds a quarter more rows
    # than the run claims, and every claimed row must have completed.
    local completed
    completed=$(psql_ -Atc "SELECT count(*) FROM $t WHERE state = 'completed'")
    [ "$completed" = $((tx * $4 * per)) ] || { echo "$1, $2: $completed completed, not $((tx * $4 * per))" >&2; exit 1; }
    awk -v s="$1" -v l="$2" -v t="$tps" -v p="$per" 'BEGIN { printf "%-13s %-34s %9.0f jobs/s\n", s, l, t * p }'
}
for shape in $SHAPES; do
    for round in $(seq "$ROUNDS"); do
        echo "== $shape, round $round"
        legs=(direct pooled)
        [ $((round % 2)) = 0 ] && legs=(pooled direct)
        for leg in "${legs[@]}"; do
            if [ "$leg" = direct ]; then
                run "$shape" "direct, $SERVER clients, simple" "$DATABASE_URL" "$SERVER" simple
                run "$shape" "direct, $SERVER clients, prepared" "$DATABASE_URL" "$SERVER" prepared
            else
                run "$shape" "PgBouncer, $SERVER on $SERVER" "$pooled" "$SERVER" simple
                run "$shape" "PgBouncer, $CLIENTS on $SERVER" "$pooled" "$CLIENTS" simple
            fi
        done
    done
done
