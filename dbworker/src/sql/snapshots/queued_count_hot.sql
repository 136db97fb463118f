SELECT count(*)::bigint FROM "example_jobs" AS "j" WHERE "j"."status" IN ('queued', 'errored') AND "j"."dbworker_live"
