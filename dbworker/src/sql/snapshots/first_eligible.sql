SELECT MIN("j"."id") AS "id" FROM "example_jobs" AS "j" WHERE "j"."status" IN ('queued', 'errored') AND ("j"."process_after" IS NULL OR "j"."process_after" <= (now()))
