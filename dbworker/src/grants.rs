//! Least privilege: each service checks at start-up the grants its own
//! statements use, and names each missing one with the table and the `GRANT`
//! that gives it, instead of failing later on the first statement with
//! PostgreSQL's bare `permission denied`. A [`JobTable`](crate::JobTable)
//! needs only `SELECT`; the services that write ask for more (see the
//! operations manual's "Roles and grants", which lists the same needs).

use sqlx::Row;

use crate::columns::{Relation, deps_table, workflow_sequence};
use crate::error::{Error, Result};
use crate::sql::{self, On, Table};

/// A table privilege.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Privilege {
    Select,
    Insert,
    Update,
    Delete,
}

impl Privilege {
    fn name(self) -> &'static str {
        match self {
            Privilege::Select => "SELECT",
            Privilege::Insert => "INSERT",
            Privilege::Update => "UPDATE",
            Privilege::Delete => "DELETE",
        }
    }

    /// The column of `sql::table_privileges` that answers for it.
    fn column(self) -> &'static str {
        match self {
            Privilege::Select => "may_select",
            Privilege::Insert => "may_insert",
            Privilege::Update => "may_update",
            Privilege::Delete => "may_delete",
        }
    }
}

use Privilege::{Delete, Insert, Select, Update};

#[derive(Debug)]
enum Need {
    /// Privileges on a table or view, `what` it is to the service.
    Table {
        what: &'static str,
        rel: Relation,
        privileges: Vec<Privilege>,
    },
    /// `USAGE` on the sequence the job table's id column draws from.
    IdSequence { table: Relation, id_column: String },
    /// `USAGE` on a sequence named in SQL, `what` it is.
    Sequence { what: String, quoted: String },
}

/// What one service needs, checked together: [`Grants::check`] reports every
/// missing grant in one [`Error::Access`].
#[derive(Debug)]
pub(crate) struct Grants {
    /// What needs them, as the message says it: "a worker", "enqueueing".
    needed_by: &'static str,
    needs: Vec<Need>,
}

impl Grants {
    pub(crate) fn new(needed_by: &'static str) -> Grants {
        Grants {
            needed_by,
            needs: Vec::new(),
        }
    }

    /// `privileges` on `rel`, the service's `what` ("table", "pause table").
    /// Asked twice for one relation, its privileges are named together.
    pub(crate) fn on(
        mut self,
        what: &'static str,
        rel: &Relation,
        privileges: &[Privilege],
    ) -> Grants {
        for need in &mut self.needs {
            if let Need::Table {
                rel: r,
                privileges: p,
                ..
            } = need
                && r.display_name() == rel.display_name()
            {
                let more: Vec<Privilege> = privileges
                    .iter()
                    .copied()
                    .filter(|x| !p.contains(x))
                    .collect();
                p.extend(more);
                return self;
            }
        }
        self.needs.push(Need::Table {
            what,
            rel: rel.clone(),
            privileges: privileges.to_vec(),
        });
        self
    }

    /// `privileges` on the job table. An insert also fires a fair table's
    /// tagging trigger, as the role that inserts.
    pub(crate) fn on_table(self, t: &Table, privileges: &[Privilege]) -> Grants {
        let g = self.on("table", &t.table, privileges);
        if privileges.contains(&Insert) {
            g.fair_tagging(t)
        } else {
            g
        }
    }

    /// On a fair table, `SELECT` on its weight table: the tagging trigger
    /// reads the key's weight as the role whose statement fired it (an
    /// insert, or a job that waits again).
    pub(crate) fn fair_tagging(self, t: &Table) -> Grants {
        match &t.fair_weights {
            Some(weights) => self.on("weight table", weights, &[Select]),
            None => self,
        }
    }

    /// `privileges` on the table's dependency table, when it has workflows.
    pub(crate) fn on_deps(self, t: &Table, privileges: &[Privilege]) -> Grants {
        if !t.workflows {
            return self;
        }
        self.on("dependency table", &deps_table(&t.table), privileges)
    }

    /// On a partitioned table with job keys, `privileges` on its key table:
    /// the table's key triggers run as the role that writes, deleting a key
    /// when its job leaves the live states (`SELECT, DELETE`) and inserting
    /// it when a job turns live (`INSERT`); a keyed enqueue also locks the
    /// holder's key row (`UPDATE`).
    pub(crate) fn on_keys(self, t: &Table, privileges: &[Privilege]) -> Grants {
        match &t.key_table {
            Some(keys) => self.on("key table", keys, privileges),
            None => self,
        }
    }

    /// `USAGE` on the sequence of the job table's id.
    pub(crate) fn id_sequence(mut self, t: &Table) -> Grants {
        self.needs.push(Need::IdSequence {
            table: t.table.clone(),
            id_column: t.columns.id.clone(),
        });
        self
    }

    /// `USAGE` on the sequence workflow ids come from, when it has workflows.
    pub(crate) fn workflow_sequence(mut self, t: &Table) -> Grants {
        if t.workflows {
            self.needs.push(Need::Sequence {
                what: "workflow ids".to_owned(),
                quoted: workflow_sequence(&t.table),
            });
        }
        self
    }

    /// What a worker's store writes and reads: `SELECT, UPDATE` on the table
    /// (claims, heartbeats, execution logs and marks are updates), `SELECT`
    /// on the pause table, `SELECT, UPDATE` on the limit table (a limited
    /// claim spends its tokens), `SELECT, UPDATE` on the signal mailbox (the
    /// wait mark reads it, a resumed attempt marks its signal consumed),
    /// `SELECT, INSERT, UPDATE` on the progress table (progress and
    /// checkpoint writes upsert a job's row, a completion drops its
    /// checkpoint) and
    /// what the triggers do in the transaction of a mark: with workflows the
    /// release trigger's, on a fair table the tagging trigger's read.
    pub(crate) fn worker(t: &Table) -> Grants {
        let mut g = Grants::new("a worker").on_table(t, &[Select, Update]);
        if let Some(pauses) = &t.pause_table {
            g = g.on("pause table", pauses, &[Select]);
        }
        if let Some(limits) = &t.limit_table {
            g = g.on("limit table", limits, &[Select, Update]);
        }
        if let Some(signals) = &t.signals {
            g = g.on("signal mailbox", signals, &[Select, Update]);
        }
        if let Some(side) = &t.progress_table {
            g = g.on("progress table", side, &[Select, Insert, Update]);
        }
        // A mark that finishes a keyed job frees its key.
        g.release_trigger(t).on_keys(t, &[Select, Delete])
    }

    /// What finishing, failing, cancelling or retrying a job needs besides
    /// the update, since the table's triggers run as the role that wrote:
    /// with workflows the release trigger reads, locks and deletes
    /// dependency edges; on a fair table a job that waits again (a retry, a
    /// reset, a requeue, a released dependent) is tagged again.
    pub(crate) fn release_trigger(self, t: &Table) -> Grants {
        self.on_deps(t, &[Select, Update, Delete]).fair_tagging(t)
    }

    /// What sending a signal needs (the table's signal function runs as the
    /// sender): `SELECT, UPDATE` on the job table (it locks the job's row and
    /// wakes a waiting job), `SELECT, INSERT` on the mailbox (`ON CONFLICT`
    /// reads the dedupe key) and `USAGE` on the mailbox's id sequence. None
    /// on a table without signals.
    pub(crate) fn signal_sender(t: &Table) -> Grants {
        let g = Grants::new("sending signals");
        let Some(signals) = &t.signals else {
            return g;
        };
        let mut g =
            g.on_table(t, &[Select, Update])
                .on("signal mailbox", signals, &[Select, Insert]);
        g.needs.push(Need::IdSequence {
            table: signals.clone(),
            id_column: "id".to_owned(),
        });
        g
    }

    /// Whether any need is a write (a privilege other than `SELECT`, or a
    /// sequence's `USAGE`): a service that writes refuses a read-only server.
    fn writes(&self) -> bool {
        self.needs.iter().any(|need| match need {
            Need::Table { privileges, .. } => privileges.iter().any(|p| *p != Select),
            Need::IdSequence { .. } | Need::Sequence { .. } => true,
        })
    }

    /// Runs the check: every missing grant, one line each, in one error.
    pub(crate) async fn check<'a>(&self, on: impl Into<On<'a>>) -> Result<()> {
        let problems = self.problems(on).await?;
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Access { problems })
        }
    }

    /// Every missing grant, one line each, with the statement that gives it.
    pub(crate) async fn problems<'a>(&self, on: impl Into<On<'a>>) -> Result<Vec<String>> {
        let mut on = on.into();
        let mut problems = Vec::new();
        let by = self.needed_by;
        if self.writes() {
            let target = match &on {
                On::Pool(pool) => format!(
                    " at {}",
                    crate::schema_check::address(&pool.connect_options())
                ),
                On::Conn(..) => String::new(),
            };
            let row = sql::server_read_only()
                .fetch_one(on.reborrow())
                .await
                .map_err(Error::db("grants"))?;
            if row.get::<bool, _>("replica") {
                problems.push(format!(
                    "the server{target} is a read-only replica (pg_is_in_recovery()), where {by} cannot write: give it the primary's URL"
                ));
            } else if row.get::<bool, _>("read_only") {
                problems.push(format!(
                    "the server{target} makes every session read-only (default_transaction_read_only = on), so {by} cannot write: give it a writable server or role"
                ));
            }
        }
        for need in &self.needs {
            match need {
                Need::Table {
                    what,
                    rel,
                    privileges,
                } => {
                    // A missing relation is named by its own check.
                    let Some(row) = fetch(on.reborrow(), sql::table_privileges(rel)).await? else {
                        continue;
                    };
                    let missing: Vec<&str> = privileges
                        .iter()
                        .filter(|p| !row.get::<bool, _>(p.column()))
                        .map(|p| p.name())
                        .collect();
                    if !missing.is_empty() {
                        let (role, name) = (row.get::<String, _>("role"), rel.display_name());
                        let missing = missing.join(", ");
                        problems.push(format!(
                            "role {role} lacks {missing} on {what} {name}, which {by} needs: GRANT {missing} ON {name} TO {role}"
                        ));
                    }
                }
                Need::IdSequence { table, id_column } => {
                    let Some(row) =
                        fetch(on.reborrow(), sql::insert_access(table, id_column)).await?
                    else {
                        continue;
                    };
                    if !row.get::<bool, _>("may_use_sequence") {
                        let role: String = row.get("role");
                        let sequence: String = row.get("sequence");
                        let name = table.display_name();
                        problems.push(format!(
                            "role {role} lacks USAGE on sequence {sequence} (the default of {name}.{id_column}), which {by} needs: GRANT USAGE ON SEQUENCE {sequence} TO {role}"
                        ));
                    }
                }
                Need::Sequence { what, quoted } => {
                    let Some(row) = fetch(on.reborrow(), sql::sequence_privilege(quoted)).await?
                    else {
                        continue;
                    };
                    if !row.get::<bool, _>("may_use") {
                        let role: String = row.get("role");
                        problems.push(format!(
                            "role {role} lacks USAGE on sequence {quoted} ({what}), which {by} needs: GRANT USAGE ON SEQUENCE {quoted} TO {role}"
                        ));
                    }
                }
            }
        }
        Ok(problems)
    }
}

async fn fetch(on: On<'_>, statement: sql::Statement) -> Result<Option<sqlx::postgres::PgRow>> {
    statement
        .fetch_optional(on)
        .await
        .map_err(Error::db("grants"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::JobTableOptions;

    #[test]
    fn a_worker_needs_what_its_tables_have() {
        let mut options = JobTableOptions::new("jobs");
        options.queue_column = Some("queue".into());
        options.pause_table = Some("dbworker_pauses".into());
        let t = options.resolve().unwrap();
        let g = Grants::worker(&t);
        let names: Vec<String> = g
            .needs
            .iter()
            .map(|n| match n {
                Need::Table { rel, .. } => rel.display_name(),
                _ => String::new(),
            })
            .collect();
        assert_eq!(names, ["jobs", "dbworker_pauses"]);
    }
}
