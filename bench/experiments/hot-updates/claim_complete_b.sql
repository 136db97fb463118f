-- One pgbench transaction: claim 100 rows from the client's cursor (:lo),
-- then complete them, as two autocommit statements.
WITH c AS (SELECT id FROM jobs_b WHERE id >= :lo AND state IN ('queued','errored') ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED), u AS (UPDATE jobs_b j SET state = 'processing', started_at = now(), last_heartbeat_at = now(), worker_hostname = 'w' FROM c WHERE j.id = c.id RETURNING j.id) SELECT string_agg(id::text, ',') AS ids, min(id) AS lo FROM u \gset
UPDATE jobs_b SET state = 'completed', finished_at = now() WHERE id = ANY(string_to_array(:ids, ',')::bigint[]) AND state = 'processing';
