SELECT pg_notify($1, '')
