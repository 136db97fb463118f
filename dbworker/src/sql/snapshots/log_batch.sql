SELECT "e".*, "e"."position"::bigint AS "dbworker_position" FROM "app"."events" AS "e" WHERE "e"."position" > $1 ORDER BY "e"."position" LIMIT $2
