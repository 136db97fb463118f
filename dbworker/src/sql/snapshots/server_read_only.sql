SELECT pg_is_in_recovery() AS "replica", current_setting('default_transaction_read_only') = 'on' AS "read_only"
