SELECT CAST(COALESCE(MAX("e"."position"), 0) AS bigint) AS "head" FROM "app"."events" AS "e"
