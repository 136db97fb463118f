#!/usr/bin/env bash
# One row write per job instead of two, at the raw-SQL floor. Today a
# heartbeat claim writes each row (state 'processing', the claim's token and
# time) and its completion writes it again, each in a transaction of its own.
# A claim that only locks its rows (FOR UPDATE SKIP LOCKED) inside a
# transaction that stays open while the jobs run, and completes them in that
# same transaction, writes each row once and commits once: a crash rolls the
# whole batch back, so the jobs come back without a resetter. This measures
# what that would gain for no-op jobs (an upper bound: real jobs keep the
# transaction, its locks and its xmin open while they run). Each shape burns
# down its own table alone, in turns, for ROUNDS rounds: jobs per second and
# WAL per job. (Not the three at once with pgbench picking a script at random:
# each table then sees a third of the clients, and the per-script latencies of
# such a run showed the one-write shape 1.5 x ahead, which alone it is not.)
#
#   DATABASE_URL=postgres://... bash bench/pgbench/one-write.sh
#
# DBWORKER=target/release/dbworker uses a built CLI instead of `cargo run`.
# Needs pgbench (PostgreSQL's own) on PATH or PGBENCH, and a scratch database:
# it drops and creates the tables ow_two, ow_cd, ow_one, ow_del, ow_arc (each with
# a _done table beside it).
BATCH=${BATCH:-50}
source "$(dirname "$0")/common.sh"

setup() { # table
    queued_table "$1"
    psql_ -c "DROP TABLE IF EXISTS $1_done" -c "CREATE TABLE $1_done (LIKE $1)"
}

lock_ids() { # table: lock a batch (no write), keep its ids in :ids
    echo "SELECT coalesce(array_agg(id), '{}') AS ids FROM ($(eligible "$1" "$BATCH")) c \\gset"
}

script() { # table, shape (two, claim-delete, one, delete, archive)
    local f="$work/$1.sql"
    case "$2" in
    two) # today's floor: the claim writes the rows, the completion again
        claim_ids "$1" "$BATCH" > "$f"
        echo "UPDATE $1 SET state = 'completed', finished_at = now() WHERE id = ANY(':ids'::bigint[]) AND state = 'processing';" >> "$f"
        ;;
    claim-delete) # the peer's shape: the claim writes the rows, the completion deletes them
        claim_ids "$1" "$BATCH" > "$f"
        echo "DELETE FROM $1 WHERE id = ANY(':ids'::bigint[]) AND state = 'processing';" >> "$f"
        ;;
    one) # lock, run, complete: one write, one commit
        echo "BEGIN;" > "$f"
        lock_ids "$1" >> "$f"
        echo "UPDATE $1 SET state = 'completed', started_at = now(), finished_at = now(), worker_hostname = 'floor' WHERE id = ANY(':ids'::bigint[]);" >> "$f"
        echo "COMMIT;" >> "$f"
        ;;
    delete) # lock, run, delete (no finished row kept)
        echo "BEGIN;" > "$f"
        lock_ids "$1" >> "$f"
        echo "DELETE FROM $1 WHERE id = ANY(':ids'::bigint[]);" >> "$f"
        echo "COMMIT;" >> "$f"
        ;;
    archive) # lock, run, move the finished rows to a table without indexes
        # (copied as they are: a real move would set their state, same bytes)
        echo "BEGIN;" > "$f"
        lock_ids "$1" >> "$f"
        echo "WITH d AS (DELETE FROM $1 WHERE id = ANY(':ids'::bigint[]) RETURNING *) INSERT INTO $1_done SELECT * FROM d;" >> "$f"
        echo "COMMIT;" >> "$f"
        ;;
    esac
    echo "$f"
}

ROUNDS=${ROUNDS:-3}
tx=$((ROWS / BATCH / CLIENTS * 3 / 4))
echo "== each shape alone on its table, in turns: $CLIENTS clients, $BATCH jobs a transaction"
for round in $(seq "$ROUNDS"); do
    for spec in "ow_two two" "ow_cd claim-delete" "ow_one one" "ow_del delete" "ow_arc archive"; do
        set -- $spec
        setup "$1"
        psql_ -c CHECKPOINT
        lsn=$(psql_ -Atc "SELECT pg_current_wal_lsn()")
        tps=$("$PGBENCH" "$DATABASE_URL" -n -c "$CLIENTS" -j 2 -t "$tx" -f "$(script "$@")" | awk '/^tps/ {print $3}')
        done_=$(psql_ -Atc "SELECT CASE WHEN '$2' IN ('claim-delete', 'delete', 'archive') THEN $ROWS - count(*) ELSE count(*) FILTER (WHERE state = 'completed') END FROM $1")
        [ "$done_" = $((tx * CLIENTS * BATCH)) ] || { echo "$1: $done_ jobs done, expected $((tx * CLIENTS * BATCH))" >&2; exit 1; }
        psql_ -Atc "SELECT 'round $round, $2: ' || round($tps * $BATCH) || ' jobs/s, ' || round((pg_current_wal_lsn() - '$lsn'::pg_lsn) / $done_) || ' B of WAL per job'"
    done
done
rm -r "$work"
