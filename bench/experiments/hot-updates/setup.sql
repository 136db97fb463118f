-- Issue 38's HOT experiment (docs/benchmarks.md, "Where 1.5 × the peer could
-- come from"): four tables of 2,000,000 queued rows with dbworker's
-- columns. jobs_a: today's layout; jobs_b: primary key only, fillfactor 30
-- (claims and completions can be HOT updates); jobs_c: today's layout, for
-- a completion that deletes the row; jobs_d: the HOT layout (a generated
-- live column, one index over it, fillfactor 30), whose claims are HOT.
DROP TABLE IF EXISTS jobs_a, jobs_b, jobs_c, jobs_d;
CREATE TABLE jobs_a (
    id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'queued', failure_message text,
    queued_at timestamptz NOT NULL DEFAULT now(), started_at timestamptz, finished_at timestamptz,
    process_after timestamptz, num_resets integer NOT NULL DEFAULT 0, num_failures integer NOT NULL DEFAULT 0,
    last_heartbeat_at timestamptz, execution_logs json[], worker_hostname text NOT NULL DEFAULT '',
    cancel boolean NOT NULL DEFAULT false);
CREATE INDEX ON jobs_a (id) WHERE state IN ('queued', 'errored');
CREATE INDEX ON jobs_a (id) WHERE state = 'processing';
ALTER TABLE jobs_a SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);
CREATE TABLE jobs_b (LIKE jobs_a INCLUDING DEFAULTS)
    WITH (fillfactor = 30, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE jobs_b ADD PRIMARY KEY (id);
CREATE TABLE jobs_c (LIKE jobs_a INCLUDING ALL);
ALTER TABLE jobs_c SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);
INSERT INTO jobs_a (queued_at) SELECT now() FROM generate_series(1, 2000000);
INSERT INTO jobs_b (queued_at) SELECT now() FROM generate_series(1, 2000000);
INSERT INTO jobs_c (queued_at) SELECT now() FROM generate_series(1, 2000000);
VACUUM ANALYZE jobs_a, jobs_b, jobs_c;
CREATE TABLE jobs_d (LIKE jobs_a INCLUDING DEFAULTS)
    WITH (fillfactor = 30, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE jobs_d ADD PRIMARY KEY (id);
ALTER TABLE jobs_d ADD COLUMN dbworker_live boolean GENERATED ALWAYS AS (state IN ('queued','errored','processing')) STORED;
CREATE INDEX ON jobs_d (id) WHERE dbworker_live;
INSERT INTO jobs_d (queued_at) SELECT now() FROM generate_series(1, 2000000);
VACUUM ANALYZE jobs_d;
