SELECT COALESCE(EXTRACT(EPOCH FROM now() - min("j"."queued_at")), 0)::float8 FROM "example_jobs" AS "j" WHERE "j"."status" IN ('queued', 'errored')
