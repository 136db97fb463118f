SELECT has_sequence_privilege(c.oid, 'USAGE') AS "may_use", current_user::text AS "role" FROM "pg_catalog"."pg_class" AS "c" WHERE (c.oid) = (to_regclass($1::text))
