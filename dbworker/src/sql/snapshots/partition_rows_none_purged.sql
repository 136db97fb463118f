SELECT count(*)::bigint AS "rows", (SELECT count(*) FROM "app"."example_jobs_p20261124" AS "dbworker_partition" WHERE NOT (false)) AS "kept" FROM "app"."example_jobs_p20261124" AS "dbworker_all"
