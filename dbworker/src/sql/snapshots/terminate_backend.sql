SELECT pg_terminate_backend(a.pid, $2::bigint) AS done FROM pg_stat_activity AS a WHERE a.pid = $1::int AND a.datname = current_database() AND a.usename = current_user
