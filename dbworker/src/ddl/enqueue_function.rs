//! `<table>_enqueue`: the SQL enqueue function for producers in other
//! languages, with the same inserts and job keys as `Enqueuer`.

use std::collections::HashMap;

use super::{OptionalColumns, functions};
use crate::columns::{Columns, Relation, literal, progress_table, quote};
use crate::enqueue::{MAX_KEY_CHARS, MAX_NAME_CHARS};
use crate::error::Result;

/// The enqueue function's parameters for the table's optional columns (the
/// key aside), each named and typed as its column; `add_jobs` passes the same.
pub(crate) fn optional_params(columns: OptionalColumns) -> Vec<(&'static str, &'static str)> {
    [
        (columns.priority, "priority", "integer"),
        (columns.queue, "queue", "text"),
        (columns.kind, "kind", "text"),
        (columns.max_retries, "max_retries", "integer"),
        (columns.flags, "flags", "text[]"),
    ]
    .into_iter()
    .filter(|(on, _, _)| *on)
    .map(|(_, name, ty)| (name, ty))
    .collect()
}

/// A PL/pgSQL function `<table>_enqueue` for producers in other languages:
/// the same inserts and job keys as [`Enqueuer`](crate::Enqueuer), in SQL.
/// `columns` says which optional columns the table has (and so which
/// parameters the function takes).
///
/// ```sql
/// SELECT email_jobs_enqueue('{"payload": {"to": "a@example.com"}}');            -- new job id
/// SELECT email_jobs_enqueue('{"payload": {}}', run_at => now() + interval '1 hour');
/// SELECT email_jobs_enqueue('{"payload": {}}', job_key => 'digest:7', key_mode => 'dedupe_only');
/// SELECT email_jobs_enqueue('{"payload": {}}', flags => ARRAY['slow-api']);      -- with --flags
/// ```
///
/// `fields` names the application's columns (unset ones take their defaults);
/// it returns the id of the job that carries the work (new, updated or kept).
/// Generated again with other columns, it replaces the function it finds
/// (other overloads are dropped first), as `add_jobs` and `reschedule_jobs` do.
pub fn enqueue_function_sql(
    table_name: &str,
    alternate_column_names: &HashMap<String, String>,
    columns: OptionalColumns,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let c = Columns::resolve(alternate_column_names)?;
    let table = rel.quoted();
    let function = rel.quoted_derived_sibling("enqueue");
    // The table as a literal for format('%s'), and the record type for
    // jsonb_populate_record.
    let table_literal = table.replace('\'', "''");
    let mut params = vec![
        "fields jsonb DEFAULT '{}'".to_owned(),
        "run_at timestamptz DEFAULT NULL".to_owned(),
    ];
    let mut signature = vec![("fields", "jsonb"), ("run_at", "timestamptz")];
    let mut extra = vec![format!("{}, run_at", literal(&c.process_after))];
    for (name, ty) in optional_params(columns) {
        params.push(format!("{name} {ty} DEFAULT NULL"));
        signature.push((name, ty));
        extra.push(format!("'{name}', {name}"));
    }
    if columns.keys {
        params.push("job_key text DEFAULT NULL".into());
        params.push("key_mode text DEFAULT 'replace'".into());
        signature.extend([("job_key", "text"), ("key_mode", "text")]);
        extra.push("'job_key', job_key".into());
    }
    let params = params.join(",\n    ");
    let extra = extra.join(", ");
    // `id` and `state` go inside format() strings: quotes doubled, `%` escaped.
    let in_format = |ident: &str| quote(ident).replace('\'', "''").replace('%', "%%");
    let (id, state) = (in_format(&c.id), in_format(&c.state));
    let process_after = literal(&c.process_after);
    let keyed = if columns.keys {
        // `fresh` is a plain literal (quotes doubled); `cap` sits in a format() string.
        let lit = |ident: &str| quote(ident).replace('\'', "''");
        // As if newly enqueued: an errored holder starts over (like sql::enqueue_keyed).
        let fresh = format!(
            "{} = ''queued'', {} = 0, {} = 0, {} = NULL, {} = NULL, {} = false",
            lit(&c.state),
            lit(&c.num_failures),
            lit(&c.num_resets),
            lit(&c.failure_message),
            lit(&c.finished_at),
            lit(&c.cancel)
        );
        // `replace` takes the new run-at even when none is given (at once),
        // as if newly enqueued.
        let run_at_now = format!("{pa} = excluded.{pa}", pa = lit(&c.process_after));
        // preserve_run_at keeps the run-at, unless the holder failed before:
        // that run-at was a retry's (like sql::enqueue_keyed).
        let retaken = format!(
            "{pa} = CASE WHEN j.{nf} > 0 THEN excluded.{pa} ELSE j.{pa} END",
            pa = lit(&c.process_after),
            nf = lit(&c.num_failures),
        );
        let retaken_waiting = format!(
            "{pa} = CASE WHEN j.{nf} > 0 OR j.\"awaiting\" IS NOT NULL THEN excluded.{pa} ELSE j.{pa} END",
            pa = lit(&c.process_after),
            nf = lit(&c.num_failures),
        );
        // A processing holder gives the key up to the new job (like sql::release_key).
        let cap = if columns.max_retries {
            format!(
                r#", "max_retries" = COALESCE({}, 0)"#,
                in_format(&c.num_failures)
            )
        } else {
            String::new()
        };
        format!(
            r#"
    IF job_key IS NOT NULL THEN
        -- NULL too: NOT IN would be NULL, and the insert below would act as
        -- a replace for a waiting holder and a dedupe for a running one.
        IF key_mode IS NULL OR key_mode NOT IN ('replace', 'preserve_run_at', 'dedupe_only', 'unsafe_dedupe') THEN
            RAISE EXCEPTION 'key_mode must be replace, preserve_run_at, dedupe_only or unsafe_dedupe, not %', key_mode;
        END IF;
        SELECT string_agg(format('%I = excluded.%I', k, k), ', ') INTO sets
          FROM jsonb_object_keys(vals) AS k
         WHERE k <> 'job_key' AND k <> {process_after};
        sets := concat_ws(', ', sets, '{fresh}');
        -- With signals, the new work waits for nothing, and the old wait's
        -- timeout is no schedule to preserve (like sql::enqueue_keyed).
        waits := EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{table_literal}'::regclass
                          AND attname = 'awaiting' AND NOT attisdropped);
        IF waits THEN
            sets := concat_ws(', ', sets, '"awaiting" = NULL');
        END IF;
        IF key_mode = 'preserve_run_at' AND waits THEN
            sets := concat_ws(', ', sets, '{retaken_waiting}');
        ELSIF key_mode = 'preserve_run_at' THEN
            sets := concat_ws(', ', sets, '{retaken}');
        ELSE
            sets := concat_ws(', ', sets, '{run_at_now}');
        END IF;
        -- The old work's progress and checkpoint do not carry over to the new.
        IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{table_literal}'::regclass
                    AND attname = 'checkpoint' AND NOT attisdropped) THEN
            sets := concat_ws(', ', sets, '"progress" = NULL, "checkpoint" = NULL');
        END IF;
        -- A live job holds at most one key. A waiting holder takes the new
        -- values (replace, preserve_run_at); a processing one gives up the key
        -- and a new job is inserted; the dedupe modes change nothing.
        FOR attempt IN 1..8 LOOP
            IF key_mode IN ('dedupe_only', 'unsafe_dedupe') THEN
                EXECUTE format('INSERT INTO %s AS j (%s) SELECT %s FROM jsonb_populate_record(NULL::%s, $1)
                    WHERE $2 <> ''unsafe_dedupe'' OR NOT EXISTS (SELECT 1 FROM %s AS f WHERE f."job_key" = $3 AND f.{state} = ''failed'')
                    ON CONFLICT ("job_key") WHERE {state} IN (''queued'', ''errored'', ''processing'') DO NOTHING
                    RETURNING j.{id}', '{table_literal}', cols, cols, '{table_literal}', '{table_literal}')
                    USING vals, key_mode, job_key INTO new_id;
            ELSE
                EXECUTE format('INSERT INTO %s AS j (%s) SELECT %s FROM jsonb_populate_record(NULL::%s, $1)
                    ON CONFLICT ("job_key") WHERE {state} IN (''queued'', ''errored'', ''processing'')
                    DO UPDATE SET %s WHERE j.{state} IN (''queued'', ''errored'')
                    RETURNING j.{id}, j.xmax <> 0', '{table_literal}', cols, cols, '{table_literal}', sets)
                    USING vals INTO new_id, replaced;
                -- A replaced holder's progress and checkpoint in the side table
                -- belong to the old work (like sql::enqueue_keyed).
                IF replaced AND to_regclass('{side_literal}') IS NOT NULL THEN
                    EXECUTE format('DELETE FROM %s WHERE "job_id" = $1', '{side_literal}') USING new_id;
                END IF;
            END IF;
            IF new_id IS NOT NULL THEN
                RETURN new_id;
            END IF;
            IF key_mode IN ('replace', 'preserve_run_at') THEN
                -- Only the key (and the retry limit) of the running job change:
                -- its state, token and marks are untouched.
                EXECUTE format('UPDATE %s SET "job_key" = NULL{cap} WHERE "job_key" = $1 AND {state} = ''processing''', '{table_literal}')
                    USING job_key;
                CONTINUE;
            END IF;
            EXECUTE format('SELECT {id} FROM %s WHERE "job_key" = $1 AND ({state} IN (''queued'', ''errored'', ''processing'') OR ($2 = ''unsafe_dedupe'' AND {state} = ''failed'')) LIMIT 1', '{table_literal}')
                USING job_key, key_mode INTO new_id;
            IF new_id IS NOT NULL THEN
                RETURN new_id;
            END IF;
        END LOOP;
        RAISE EXCEPTION 'the job holding key % kept changing; try again', job_key;
    END IF;"#,
            state = state,
            id = id,
            side_literal = progress_table(&rel).quoted().replace('\'', "''"),
        )
    } else {
        String::new()
    };
    // Enqueuer's length limits (check_job), so a producer in SQL meets the
    // same rules; the fairness key is a field, present on fair tables.
    let mut limited = vec![("fields->>'fair_key'", "fair_key", MAX_KEY_CHARS)];
    if columns.queue {
        limited.push(("queue", "queue", MAX_NAME_CHARS));
    }
    if columns.kind {
        limited.push(("kind", "kind", MAX_NAME_CHARS));
    }
    if columns.keys {
        limited.push(("job_key", "job_key", MAX_KEY_CHARS));
    }
    let check_lengths: String = limited
        .iter()
        .map(|(value, name, max)| {
            format!(
                "\n    IF char_length({value}) > {max} THEN\n        RAISE EXCEPTION '{name} is % characters long; at most {max} are allowed', char_length({value});\n    END IF;"
            )
        })
        .collect();
    // Standard columns are dbworker's, like in NewJob::set.
    let standard: Vec<String> = c
        .expected_types()
        .iter()
        .map(|(_, name, _)| literal(name))
        .collect();
    Ok(format!(
        r#"{drop}-- Enqueues a job into {table}: `fields` holds the application's columns.
CREATE OR REPLACE FUNCTION {function}(
    {params}
) RETURNS bigint LANGUAGE plpgsql AS $dbworker$
DECLARE
    vals jsonb;
    cols text;
    sets text;
    new_id bigint;
    replaced boolean;
    waits boolean;
    bad text;
BEGIN
    SELECT k INTO bad FROM jsonb_object_keys(COALESCE(fields, '{{}}')) AS k
     WHERE k IN ({standard}{optional_names}) LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'column % is managed by dbworker; use the function''s parameters', bad;
    END IF;{check_retries}{check_lengths}
    vals := COALESCE(fields, '{{}}') || jsonb_strip_nulls(jsonb_build_object({extra}));
    SELECT string_agg(format('%I', k), ', ') INTO cols FROM jsonb_object_keys(vals) AS k;
    IF cols IS NULL THEN
        EXECUTE format('INSERT INTO %s DEFAULT VALUES RETURNING {id_escaped}', '{table_literal}') INTO new_id;
        RETURN new_id;
    END IF;{keyed}
    EXECUTE format('INSERT INTO %s (%s) SELECT %s FROM jsonb_populate_record(NULL::%s, $1) RETURNING {id_escaped}', '{table_literal}', cols, cols, '{table_literal}')
        USING vals INTO new_id;
    RETURN new_id;
END
$dbworker$;
"#,
        drop = functions::drop_other_overloads(&rel, "enqueue", &signature),
        standard = standard.join(", "),
        optional_names = if columns != OptionalColumns::default() {
            ", 'job_key', 'queue', 'priority', 'max_retries', 'kind', 'flags'"
        } else {
            ""
        },
        id_escaped = id,
        // A negative limit would fail the job for good at its first error.
        check_retries = if columns.max_retries {
            "\n    IF max_retries < 0 THEN\n        RAISE EXCEPTION 'max_retries must be 0 or more, not %', max_retries;\n    END IF;"
        } else {
            ""
        },
    ))
}
