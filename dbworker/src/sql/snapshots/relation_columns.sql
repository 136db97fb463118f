SELECT "column_name", "udt_name" FROM "information_schema"."columns" WHERE "table_name" = $1 AND "table_schema" = (current_schema()) ORDER BY "ordinal_position" ASC
