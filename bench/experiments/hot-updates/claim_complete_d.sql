-- The same on the HOT layout: the claim names the live column, so it reads
-- the layout's index.
WITH c AS (SELECT id FROM jobs_d WHERE id >= :lo AND dbworker_live AND state IN ('queued','errored') ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED), u AS (UPDATE jobs_d j SET state = 'processing', started_at = now(), last_heartbeat_at = now(), worker_hostname = 'w' FROM c WHERE j.id = c.id RETURNING j.id) SELECT string_agg(id::text, ',') AS ids, min(id) AS lo FROM u \gset
UPDATE jobs_d SET state = 'completed', finished_at = now() WHERE id = ANY(string_to_array(:ids, ',')::bigint[]) AND state = 'processing';
