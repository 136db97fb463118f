SELECT count(pg_advisory_xact_lock(hashtextextended($1, "lane"))) FROM generate_series($2, $3) AS "lane"
