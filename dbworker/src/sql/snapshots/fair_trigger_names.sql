SELECT tgname::text AS "name" FROM "pg_trigger" WHERE tgrelid = to_regclass($1::text) AND tgname = ANY($2::text[])
