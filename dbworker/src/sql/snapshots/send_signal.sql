SELECT "example_jobs_signal"($1, $2, $3::jsonb, $4) AS "sent"
