SELECT EXTRACT(EPOCH FROM now())::float8 AS "now", to_regclass($1) IS NOT NULL AS "exists"
