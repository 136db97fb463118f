SELECT nextval($1::regclass)::bigint AS "id"
