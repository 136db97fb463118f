//! The names of a partitioned job table's companions: the function that
//! creates its partitions and the key table that holds its job keys.

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
