SELECT COALESCE(sum(GREATEST(c.reltuples, 0)), 0)::bigint AS "rows" FROM pg_partition_tree(to_regclass($1::text)) AS "p" INNER JOIN "pg_catalog"."pg_class" AS "c" ON c.oid = p.relid WHERE p.isleaf
