//! Which statements return only types sqlx decodes without asking the
//! server: behind a transaction pooler such a statement needs no savepoint in
//! a caller's transaction, since sqlx's type lookup (a simple query that
//! discards the unnamed statement) never runs for it (see `pooler.rs`). And
//! which return only types sqlx decodes as well from text as from binary:
//! such a statement can go as one simple-protocol message, whose rows come
//! back as text.

use std::collections::HashSet;
use std::sync::{LazyLock, RwLock};

use sqlx::postgres::PgRow;
use sqlx::{Column, Row, TypeInfo};

/// Built-in types (their OIDs are fixed by PostgreSQL's catalog) that sqlx
/// knows by OID, so it never looks them up: a subset of its list, holding
/// every type dbworker's own statements return. A type missing here only
/// costs the savepoint.
const BUILTIN: [u32; 37] = [
    16, 17, 18, 19, 20, 21, 23, 25, 26, 114, 199, 700, 701, 705, 1000, 1001, 1005, 1007, 1009,
    1015, 1016, 1021, 1022, 1042, 1043, 1082, 1083, 1114, 1184, 1185, 1186, 1231, 1700, 2278, 2950,
    2951, 3802,
];

/// Built-in types whose text form sqlx decodes to the same value as their
/// binary form, with the session settings sqlx connects with (`DateStyle`
/// ISO, `TimeZone` UTC): no `"char"` (its text is the character, not the
/// number), no interval (sqlx refuses its text form), no numeric, no
/// bytea (its text form depends on the server's `bytea_output`), no `text[]`
/// (sqlx reads an element `"NULL"` from text as a NULL).
const TEXT_SAFE: [u32; 20] = [
    16, 19, 20, 21, 23, 25, 26, 114, 199, 700, 701, 1000, 1005, 1007, 1016, 1042, 1043, 1114, 1184,
    3802,
];

/// The most statement texts remembered: a statement whose text varies (a
/// multi-row insert renders one text per row count) must not grow the set
/// without end; past the cap a new text keeps paying the savepoint.
const MAX_KNOWN: usize = 1024;

type Known = LazyLock<RwLock<HashSet<std::sync::Arc<str>>>>;

/// The statements (by their text) seen to return only [`BUILTIN`] types.
static KNOWN: Known = LazyLock::new(|| RwLock::new(HashSet::new()));

/// The statements seen to return only [`TEXT_SAFE`] types.
static TEXT: Known = LazyLock::new(|| RwLock::new(HashSet::new()));

/// Whether `sql` was seen to return only built-in types.
pub(super) fn builtin(sql: &str) -> bool {
    contains(&KNOWN, sql)
}

/// Whether `sql` was seen to return only types read the same from text.
pub(super) fn text_safe(sql: &str) -> bool {
    contains(&TEXT, sql)
}

fn contains(set: &Known, sql: &str) -> bool {
    set.read().unwrap_or_else(|e| e.into_inner()).contains(sql)
}

/// Records what `sql` was seen to return when its first row (the columns
/// are the same in every row) shows it; no row shows nothing.
pub(super) fn record(sql: &std::sync::Arc<str>, rows: &[PgRow]) {
    let Some(row) = rows.first() else {
        return;
    };
    let all_in = |list: &[u32]| {
        row.columns().iter().all(|c| {
            let ty = c.type_info();
            !ty.is_null() && ty.oid().is_some_and(|oid| list.contains(&oid.0))
        })
    };
    for (set, list) in [(&KNOWN, &BUILTIN[..]), (&TEXT, &TEXT_SAFE[..])] {
        if all_in(list) && !contains(set, sql) {
            let mut known = set.write().unwrap_or_else(|e| e.into_inner());
            if known.len() < MAX_KNOWN {
                known.insert(sql.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{BUILTIN, TEXT_SAFE};

    #[test]
    fn the_builtin_list_is_sorted_and_has_no_user_type() {
        assert!(BUILTIN.windows(2).all(|w| w[0] < w[1]));
        // PostgreSQL gives user-defined types OIDs from 16384 up.
        assert!(BUILTIN.iter().all(|&oid| oid < 16_384));
    }

    #[test]
    fn every_text_safe_type_is_builtin_and_none_reads_differently_from_text() {
        assert!(TEXT_SAFE.windows(2).all(|w| w[0] < w[1]));
        assert!(TEXT_SAFE.iter().all(|oid| BUILTIN.contains(oid)));
        // "char", bytea, interval, numeric, text[].
        assert!(
            [18, 17, 1186, 1700, 1009]
                .iter()
                .all(|oid| !TEXT_SAFE.contains(oid))
        );
    }
}
