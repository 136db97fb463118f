SELECT "v".* FROM "example_jobs_with_repository_name" AS "v" WHERE false ORDER BY v.repository_id ASC, v.id DESC NULLS LAST
