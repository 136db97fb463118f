INSERT INTO "app"."example_jobs_deps" ("job_id", "depends_on", "policy") SELECT unnest($1::bigint[]), unnest($2::bigint[]), unnest($3::text[])
