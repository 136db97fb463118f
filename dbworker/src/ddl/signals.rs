//! Durable waits and signals: the column a waiting job names its signal in,
//! the mailbox, and the function that sends a signal.

use std::collections::HashMap;

use crate::columns::{AWAITING, Columns, Relation, literal, quote, signals_table};
use crate::error::Result;
use crate::notify::Listen;

/// Statements (safe to run again) that let jobs of `table_name` wait for
/// signals (see [waits and signals](crate::guide#durable-waits-and-signals)):
///
/// - the column `awaiting text`: the signal a waiting job waits for;
/// - the mailbox `<table>_signals (id, job_id, name, payload, dedupe_key,
///   sent_at, consumed_at, consumed_token, traceparent)`: every signal sent,
///   kept after it is consumed (the job's history of signals), unique per job
///   and dedupe key; `traceparent` defaults to the session setting
///   `dbworker.traceparent` (the sender's span), which the attempt consuming
///   the signal links to on a table with traces;
/// - `<table>_signal(job_id, name, payload, dedupe)` and
///   `<table>_signal_key(job_key, …)`, which send one: the job's row is
///   locked first, so a job that is about to wait sees the signal, and a job
///   that waits is woken (its next run time becomes now, with a NOTIFY on the
///   table's default channel). They return whether the signal is new.
///
/// ```
/// let ddl = dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap();
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "jobs_signals""#));
/// ```
pub fn signals_sql(
    table_name: &str,
    alternate_column_names: &HashMap<String, String>,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let c = Columns::resolve(alternate_column_names)?;
    let table = rel.quoted();
    let signals = signals_table(&rel).quoted();
    let index = |suffix: &str| rel.quoted_derived(suffix);
    let function = rel.quoted_derived_sibling("signal");
    let by_key = rel.quoted_derived_sibling("signal_key");
    let (id, state, process_after) = (quote(&c.id), quote(&c.state), quote(&c.process_after));
    let awaiting = quote(AWAITING);
    let channel = literal(&Listen::TableChannel.resolve(&rel)?.unwrap_or_default());
    Ok(format!(
        r#"-- Durable waits and signals: a job waits for a named signal (awaiting), a
-- sender puts it in the mailbox and wakes the job.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {awaiting} text;
CREATE TABLE IF NOT EXISTS {signals} (
    "id" bigserial PRIMARY KEY,
    "job_id" bigint NOT NULL,
    "name" text NOT NULL,
    "payload" jsonb,
    "dedupe_key" text,
    "sent_at" timestamptz NOT NULL DEFAULT now(),
    "consumed_at" timestamptz,
    "consumed_token" bigint,
    UNIQUE ("job_id", "dedupe_key")
);
-- The sender's trace context (SET LOCAL dbworker.traceparent; Signals::send
-- sets it from the current span): the attempt that consumes the signal links
-- to it, on a table with traces. Added here for mailboxes created before it.
ALTER TABLE {signals} ADD COLUMN IF NOT EXISTS "traceparent" text DEFAULT nullif(current_setting('dbworker.traceparent', true), '');
CREATE INDEX IF NOT EXISTS {mailbox_idx} ON {signals} ("job_id", "name", "id") WHERE "consumed_at" IS NULL;
-- Sends a signal: locks the job's row first (the wait mark does too), so a
-- wait that begins while this runs sees the signal, and a wait that began
-- before is woken. Returns whether the signal is new (false: a duplicate of
-- its dedupe key). A job that does not exist is an error.
CREATE OR REPLACE FUNCTION {function}(p_job_id bigint, p_name text, p_payload jsonb DEFAULT NULL, p_dedupe text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql AS $signal$
BEGIN
    PERFORM 1 FROM {table} AS j WHERE j.{id} = p_job_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job % in %', p_job_id, {table_literal} USING ERRCODE = 'no_data_found';
    END IF;
    INSERT INTO {signals} ("job_id", "name", "payload", "dedupe_key")
        VALUES (p_job_id, p_name, p_payload, p_dedupe)
        ON CONFLICT ("job_id", "dedupe_key") DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE {table} AS j SET {process_after} = now(), {awaiting} = NULL
     WHERE j.{id} = p_job_id AND j.{awaiting} = p_name AND j.{state} IN ('queued', 'errored');
    IF FOUND THEN
        PERFORM pg_notify({channel}, p_job_id::text);
    END IF;
    RETURN true;
END
$signal$;
-- The same, to the live job holding a key (needs the job_key column). The
-- holder found is locked with the key checked again: one that let the key
-- go meanwhile (a transaction committing while this waited for its row) is
-- passed over for the job holding it now.
CREATE OR REPLACE FUNCTION {by_key}(p_job_key text, p_name text, p_payload jsonb DEFAULT NULL, p_dedupe text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql AS $signal$
DECLARE
    v_id bigint;
BEGIN
    FOR attempt IN 1..10 LOOP
        SELECT j.{id} INTO v_id FROM {table} AS j
         WHERE j."job_key" = p_job_key AND j.{state} IN ('queued', 'errored', 'processing');
        IF v_id IS NULL THEN
            RAISE EXCEPTION 'no live job holds key % in %', p_job_key, {table_literal} USING ERRCODE = 'no_data_found';
        END IF;
        PERFORM 1 FROM {table} AS j
         WHERE j.{id} = v_id AND j."job_key" = p_job_key AND j.{state} IN ('queued', 'errored', 'processing')
           FOR NO KEY UPDATE;
        IF FOUND THEN
            RETURN {function}(v_id, p_name, p_payload, p_dedupe);
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the job holding key % in % kept changing', p_job_key, {table_literal} USING ERRCODE = 'serialization_failure';
END
$signal$;
"#,
        mailbox_idx = index("signals_mailbox_idx"),
        table_literal = literal(&rel.display_name()),
    ))
}
