SELECT set_config('dbworker.traceparent', $1, true) AS "traceparent", set_config('dbworker.tracestate', $2, true) AS "tracestate"
