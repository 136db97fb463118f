//! The names of a partitioned job table's companions: the function that
//! creates its partitions, the key table that holds its job keys and the
//! triggers that keep it.

use super::Relation;

/// The SQL function that creates a partitioned table's upcoming partitions
/// (`<table>_create_partitions`), schema-qualified like the table and quoted.
pub(crate) fn create_partitions_function(rel: &Relation) -> String {
    rel.quoted_derived_sibling("create_partitions")
}

/// The key table of a partitioned job table (`<table>_keys`): one row per live
/// job holding a key, primary key on the key.
pub(crate) fn key_table(rel: &Relation) -> Relation {
    let name = rel.derived("keys");
    Relation {
        alias: name.clone(),
        name,
        schema: rel.schema.clone(),
    }
}

/// The column the key triggers read: the key table is kept for it alone.
pub(crate) const PARTITION_KEY_COLUMN: &str = "job_key";

/// The triggers that keep a partitioned table's key table in step: on
/// insert, on an update of the state or key, and on delete.
pub(crate) fn key_triggers(rel: &Relation) -> [String; 3] {
    [
        rel.derived("keys_insert"),
        rel.derived("keys_update"),
        rel.derived("keys_delete"),
    ]
}
