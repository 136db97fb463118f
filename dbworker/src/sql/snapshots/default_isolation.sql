SELECT current_setting('default_transaction_isolation') AS "isolation"
