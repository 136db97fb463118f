SELECT tgname::text AS "name", tgenabled <> 'D' AS "enabled" FROM "pg_catalog"."pg_trigger" WHERE tgrelid = to_regclass($1::text) AND tgname = ANY($2::text[])
