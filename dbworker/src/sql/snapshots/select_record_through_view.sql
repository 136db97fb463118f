SELECT "v".* FROM "example_jobs_with_repository_name" AS "v" WHERE "v"."id" = $1
