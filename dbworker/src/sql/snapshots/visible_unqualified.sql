SELECT to_regclass($1::text) IS NOT NULL AND to_regclass($2::text) = to_regclass($3::text) AS "same"
