SELECT "e".*, CAST("e"."position" AS bigint) AS "dbworker_position" FROM "app"."events" AS "e" WHERE "e"."position" > $1 ORDER BY "e"."position" ASC LIMIT $2
