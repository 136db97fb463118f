SELECT "j".* FROM "example_jobs" AS "j" WHERE "j"."id" = $1
