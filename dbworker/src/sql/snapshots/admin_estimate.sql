SELECT GREATEST(c.reltuples, 0)::bigint AS "rows" FROM "pg_catalog"."pg_class" AS "c" WHERE (c.oid) = (to_regclass($1::text))
