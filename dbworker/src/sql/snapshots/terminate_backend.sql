SELECT pg_terminate_backend(a.pid) AS done FROM pg_stat_activity AS a WHERE a.pid = $1::int AND a.datname = current_database() AND (EXTRACT(EPOCH FROM a.xact_start) * 1000000)::bigint = $2::bigint
