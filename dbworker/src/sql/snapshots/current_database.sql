SELECT current_database()::text AS "db"
