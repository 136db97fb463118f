SELECT "lane" FROM (SELECT (("step" + $1) % $2)::bigint AS "lane" FROM generate_series($3, $4) AS "step") AS "dbworker_lanes" WHERE pg_try_advisory_xact_lock(hashtextextended($5, "lane")) LIMIT $6
