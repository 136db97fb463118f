SELECT c.relrowsecurity AND NOT r.rolbypassrls AND (c.relforcerowsecurity OR c.relowner <> r.oid) AS "hides" FROM pg_class AS c, pg_roles AS r WHERE c.oid = $1::regclass AND r.rolname = current_user
