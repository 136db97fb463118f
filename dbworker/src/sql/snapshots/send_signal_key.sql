SELECT "example_jobs_signal_key"($1, $2, $3::jsonb, $4) AS "sent"
