//! Which statements return only types sqlx decodes without asking the
//! server: behind a transaction pooler such a statement needs no savepoint in
//! a caller's transaction, since sqlx's type lookup (a simple query that
//! discards the unnamed statement) never runs for it (see `pooler.rs`).

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

/// The most statement texts remembered: a statement whose text varies (a
/// multi-row insert renders one text per row count) must not grow the set
/// without end; past the cap a new text keeps paying the savepoint.
const MAX_KNOWN: usize = 1024;

/// The statements (by their text) seen to return only [`BUILTIN`] types.
static KNOWN: LazyLock<RwLock<HashSet<std::sync::Arc<str>>>> =
    LazyLock::new(|| RwLock::new(HashSet::new()));

/// Whether `sql` was seen to return only built-in types.
pub(super) fn builtin(sql: &str) -> bool {
    KNOWN
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .contains(sql)
}

/// Records `sql` as returning only built-in types when its first row (the
/// columns are the same in every row) shows that; no row shows nothing.
pub(super) fn record(sql: &std::sync::Arc<str>, rows: &[PgRow]) {
    let Some(row) = rows.first() else {
        return;
    };
    let all_builtin = row.columns().iter().all(|c| {
        let ty = c.type_info();
        !ty.is_null() && ty.oid().is_some_and(|oid| BUILTIN.contains(&oid.0))
    });
    if all_builtin {
        let mut known = KNOWN.write().unwrap_or_else(|e| e.into_inner());
        if known.len() < MAX_KNOWN {
            known.insert(sql.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BUILTIN;

    #[test]
    fn the_builtin_list_is_sorted_and_has_no_user_type() {
        assert!(BUILTIN.windows(2).all(|w| w[0] < w[1]));
        // PostgreSQL gives user-defined types OIDs from 16384 up.
        assert!(BUILTIN.iter().all(|&oid| oid < 16_384));
    }
}
