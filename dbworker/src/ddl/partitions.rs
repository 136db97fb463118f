//! The partitioned job table: ranges of `queued_at`, a default partition so an
//! insert never fails, a SQL function that creates upcoming partitions, and the
//! key table that stands in for the unique key index a partitioned table cannot
//! have.

use std::collections::HashMap;
use std::str::FromStr;

use crate::columns::{
    Columns, Relation, bounded_name_to, create_partitions_function, key_table, literal, quote,
};
use crate::error::{Error, Result};

use super::{AUTOVACUUM, standard_columns};

/// How much of `queued_at` one partition of a partitioned job table holds.
/// Boundaries are aligned in UTC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartitionInterval {
    /// One hour per partition.
    Hour,
    /// One day per partition (the default).
    #[default]
    Day,
    /// One week (from Monday) per partition.
    Week,
    /// One calendar month per partition.
    Month,
}

impl PartitionInterval {
    /// The `date_trunc` field and the `to_char` format of partition names.
    fn parts(self) -> (&'static str, &'static str) {
        match self {
            PartitionInterval::Hour => ("hour", "YYYYMMDD\"h\"HH24"),
            PartitionInterval::Day => ("day", "YYYYMMDD"),
            PartitionInterval::Week => ("week", "YYYYMMDD"),
            PartitionInterval::Month => ("month", "YYYYMM"),
        }
    }
}

impl FromStr for PartitionInterval {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "hour" => Ok(PartitionInterval::Hour),
            "day" => Ok(PartitionInterval::Day),
            "week" => Ok(PartitionInterval::Week),
            "month" => Ok(PartitionInterval::Month),
            other => Err(Error::InvalidOption {
                field: "partition_interval",
                reason: format!("{other:?} is not hour, day, week or month"),
            }),
        }
    }
}

/// A job table partitioned by range of `queued_at`, with what every feature
/// needs on it:
///
/// - the primary key is `(id, queued_at)` (Postgres requires the partition key
///   in it); ids still come from one sequence, so `id` stays unique across
///   partitions and statements keep finding a job by its id alone;
/// - the claim's and the resetter's partial indexes, created on every partition;
/// - a default partition, so an insert outside every range never fails;
/// - `<table>_create_partitions(ahead integer DEFAULT 3, since timestamptz
///   DEFAULT now())`, which creates the missing partitions from the one holding
///   `since` to `ahead` intervals past the current one, each with the job
///   table's autovacuum settings, and returns their names. It is called once
///   here; the [`Purger`](crate::maintenance::Purger) and `dbworker partitions
///   create` call it again. A range whose rows already sit in the default
///   partition is skipped with a warning (Postgres cannot create it then).
///
/// ```
/// use dbworker::ddl::{PartitionInterval, partitioned_job_table_sql};
/// let ddl = partitioned_job_table_sql("jobs", &Default::default(), PartitionInterval::Day).unwrap();
/// assert!(ddl.contains(r#"PRIMARY KEY ("id", "queued_at")"#));
/// assert!(ddl.contains(r#"PARTITION BY RANGE ("queued_at")"#));
/// ```
pub fn partitioned_job_table_sql(
    table_name: &str,
    alternate_column_names: &HashMap<String, String>,
    interval: PartitionInterval,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let c = Columns::resolve(alternate_column_names)?;
    let table = rel.quoted();
    let index = |suffix: &str| rel.quoted_derived(suffix);
    let (id, state, queued_at) = (quote(&c.id), quote(&c.state), quote(&c.queued_at));
    let default = rel.quoted_derived_sibling("default");
    let function = create_partitions_function(&rel);
    // Room for the longest date suffix (`2026112400` plus `h`).
    let prefix = literal(&bounded_name_to(&format!("{}_p", rel.name), 52));
    let (field, format) = interval.parts();
    let table_literal = literal(&table);
    Ok(format!(
        r#"CREATE TABLE IF NOT EXISTS {table} (
{columns},
    PRIMARY KEY ({id}, {queued_at})
) PARTITION BY RANGE ({queued_at});

-- The claim scans eligible rows in id order; a partial index keeps it small.
CREATE INDEX IF NOT EXISTS {dequeue_idx} ON {table} ({id}) WHERE {state} IN ('queued', 'errored');
-- The resetter looks only at processing rows.
CREATE INDEX IF NOT EXISTS {processing_idx} ON {table} ({id}) WHERE {state} = 'processing';
-- Rows no range holds land here, so an insert never fails.
CREATE TABLE IF NOT EXISTS {default} PARTITION OF {table} DEFAULT;
-- Claims leave dead index entries behind; vacuum every partition often.
ALTER TABLE {default} SET ({AUTOVACUUM});

-- Creates the missing partitions from the one holding `since` to `ahead`
-- {field}s past the current one; returns their names.
CREATE OR REPLACE FUNCTION {function}(ahead integer DEFAULT 3, since timestamptz DEFAULT now())
RETURNS SETOF text LANGUAGE plpgsql AS $dbworker$
DECLARE
    lower timestamptz := date_trunc('{field}', least(since, now()), 'UTC');
    stop timestamptz := date_trunc('{field}', now(), 'UTC') + (greatest(ahead, 0) + 1) * interval '1 {field}';
    upper timestamptz;
    part text;
    nsp text;
BEGIN
    -- Creators take turns (a purger's pass, `dbworker partitions create`):
    -- the look and the CREATE are not atomic, and a second creator of one
    -- partition would fail its whole call.
    PERFORM pg_advisory_xact_lock(hashtext({table_literal} || '/create_partitions'));
    SELECT c.relnamespace::regnamespace::text INTO nsp FROM pg_class c WHERE c.oid = {table_literal}::regclass;
    WHILE lower < stop LOOP
        upper := lower + interval '1 {field}';
        part := {prefix} || to_char(lower AT TIME ZONE 'UTC', '{format}');
        IF to_regclass(format('%s.%I', nsp, part)) IS NULL THEN
            IF EXISTS (SELECT 1 FROM {default} WHERE {queued_at} >= lower AND {queued_at} < upper) THEN
                RAISE WARNING 'partition % not created: the default partition holds rows queued in [%, %)', part, lower, upper;
            ELSE
                EXECUTE format('CREATE TABLE %s.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L) WITH ({AUTOVACUUM})',
                    nsp, part, {table_literal}, lower, upper);
                RETURN NEXT part;
            END IF;
        END IF;
        lower := upper;
    END LOOP;
END
$dbworker$;
SELECT {function}();
"#,
        columns = standard_columns(&c, "bigserial"),
        dequeue_idx = index("dequeue_idx"),
        processing_idx = index("processing_idx"),
    ))
}

/// Job keys on a partitioned table. A unique index there must include
/// `queued_at`, which would make every key unique per enqueue instant: no
/// promise at all. So the table keeps the same promise as the plain table's
/// unique index (at most one queued, errored or processing job per key, across
/// every partition) through a key table, `<table>_keys (job_key PRIMARY KEY,
/// job_id)`, that triggers on the job table keep in step in the same
/// transaction: a row turning live with a key inserts its key (a second live
/// holder fails with a unique violation, as with the index), a row leaving the
/// live states, changing its key or being deleted removes it.
///
/// ```
/// let ddl = dbworker::ddl::partitioned_keys_sql("jobs", &Default::default()).unwrap();
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "jobs_keys""#));
/// ```
pub fn partitioned_keys_sql(
    table_name: &str,
    alternate_column_names: &HashMap<String, String>,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let c = Columns::resolve(alternate_column_names)?;
    let table = rel.quoted();
    let keys = key_table(&rel).quoted();
    let index = |suffix: &str| rel.quoted_derived(suffix);
    let function = rel.quoted_derived_sibling("keys_sync");
    let [insert_trigger, update_trigger, delete_trigger] =
        crate::columns::key_triggers(&rel).map(|name| quote(&name));
    let (id, state) = (quote(&c.id), quote(&c.state));
    let live = |row: &str| format!("{row}.{state} IN ('queued', 'errored', 'processing')");
    Ok(format!(
        r#"-- Job keys: at most one live (queued, errored or processing) job per key,
-- across every partition, kept by the key table the triggers below maintain.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "job_key" text;
CREATE INDEX IF NOT EXISTS {key_idx} ON {table} ("job_key") WHERE {state} IN ('queued', 'errored', 'processing');
-- The unsafe_dedupe key mode also looks for failed jobs with the key.
CREATE INDEX IF NOT EXISTS {failed_key_idx} ON {table} ("job_key") WHERE {state} = 'failed';
CREATE TABLE IF NOT EXISTS {keys} (
    "job_key" text PRIMARY KEY,
    "job_id" bigint NOT NULL
);
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $dbworker$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD."job_key" IS NOT NULL AND {old_live}
       AND (TG_OP = 'DELETE' OR NEW."job_key" IS DISTINCT FROM OLD."job_key" OR NOT {new_live}) THEN
        DELETE FROM {keys} WHERE "job_key" = OLD."job_key" AND "job_id" = OLD.{id};
    END IF;
    IF TG_OP <> 'DELETE' AND NEW."job_key" IS NOT NULL AND {new_live}
       AND (TG_OP = 'INSERT' OR OLD."job_key" IS DISTINCT FROM NEW."job_key" OR NOT {old_live}) THEN
        -- A unique violation here: another live job holds the key.
        INSERT INTO {keys} ("job_key", "job_id") VALUES (NEW."job_key", NEW.{id});
    END IF;
    RETURN NULL;
END
$dbworker$;
-- Replaced in place, never dropped first: run again statement by statement
-- on a live table, a keyed insert or a holder's completion falling between a
-- DROP and its CREATE would miss the key table for good.
CREATE OR REPLACE TRIGGER {insert_trigger} AFTER INSERT ON {table}
    FOR EACH ROW WHEN (NEW."job_key" IS NOT NULL) EXECUTE FUNCTION {function}();
CREATE OR REPLACE TRIGGER {update_trigger} AFTER UPDATE OF {state}, "job_key" ON {table}
    FOR EACH ROW WHEN (OLD."job_key" IS NOT NULL OR NEW."job_key" IS NOT NULL) EXECUTE FUNCTION {function}();
CREATE OR REPLACE TRIGGER {delete_trigger} AFTER DELETE ON {table}
    FOR EACH ROW WHEN (OLD."job_key" IS NOT NULL) EXECUTE FUNCTION {function}();
"#,
        key_idx = index("job_key_idx"),
        failed_key_idx = index("job_key_failed_idx"),
        old_live = live("OLD"),
        new_live = live("NEW"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_and_intervals_reach_the_ddl() {
        let renames = HashMap::from([("queued_at".to_owned(), "created_at".to_owned())]);
        let ddl =
            partitioned_job_table_sql("app.jobs", &renames, PartitionInterval::Month).unwrap();
        assert!(ddl.contains(r#"PRIMARY KEY ("id", "created_at")"#), "{ddl}");
        assert!(ddl.contains(
            r#"CREATE TABLE IF NOT EXISTS "app"."jobs_default" PARTITION OF "app"."jobs" DEFAULT"#
        ));
        assert!(ddl.contains("date_trunc('month'"));
        assert!(ddl.contains(r#"FUNCTION "app"."jobs_create_partitions"("#));
        assert!(!ddl.contains("PRIMARY KEY,"), "the id alone is no key");
        assert_eq!(
            "week".parse::<PartitionInterval>().unwrap(),
            PartitionInterval::Week
        );
        assert!("fortnight".parse::<PartitionInterval>().is_err());
    }

    #[test]
    fn long_names_leave_room_for_the_date() {
        let long = "j".repeat(60);
        let ddl =
            partitioned_job_table_sql(&long, &HashMap::new(), PartitionInterval::Hour).unwrap();
        let prefix = ddl
            .split("part := '")
            .nth(1)
            .unwrap()
            .split('\'')
            .next()
            .unwrap();
        assert!(prefix.len() + "20261124h10".len() <= 63, "{prefix}");
    }

    /// Run again statement by statement on a live table, the key triggers
    /// are replaced in place: a DROP before each CREATE left a moment in
    /// which a keyed insert, or a holder's completion, missed the key table.
    #[test]
    fn the_key_triggers_are_replaced_never_dropped() {
        let ddl = partitioned_keys_sql("jobs", &HashMap::new()).unwrap();
        assert!(!ddl.contains("DROP TRIGGER"), "{ddl}");
        assert_eq!(ddl.matches("CREATE OR REPLACE TRIGGER").count(), 3, "{ddl}");
    }
}
