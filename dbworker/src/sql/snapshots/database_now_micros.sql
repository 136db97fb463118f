SELECT (EXTRACT(EPOCH FROM now()) * 1000000)::bigint AS "now"
