SELECT set_config('lock_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $2, true)
