SELECT to_regproc($1::text) IS NOT NULL AS "exists"
