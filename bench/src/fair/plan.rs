//! The claim's plan, from the store's own statement: its text as the store's
//! connection last sent it (`pg_stat_activity`, literals intact, where
//! `pg_stat_statements` would have turned the state literals into
//! parameters and hidden the partial indexes from the planner), prepared on
//! a bench connection and explained. It runs five times and is explained
//! with ANALYZE on the sixth, inside a transaction rolled back, so the plan
//! shown is the one Postgres's plan cache picks for the store's prepared
//! statement (custom or generic); the other kind is explained too.

use std::time::Duration;

use sqlx::{AssertSqlSafe, Connection, PgConnection};

use super::claim::CLAIM_SIZE;
use crate::Result;
use crate::db::Bench;

/// The name the bench prepares the claim under.
const NAME: &str = "bench_fair_claim";

/// A plan node: its type, index or relation, and the nodes under it.
#[derive(Debug)]
pub(crate) struct Node {
    /// `Index Scan using bench_jobs_fair_claim_idx`, `Sort`, ...
    label: String,
    /// `CTE dbworker_candidates`, `InitPlan 1 (returns $0)`, ...
    subplan: Option<String>,
    children: Vec<Node>,
}

impl Node {
    fn parse(plan: &serde_json::Value) -> Node {
        let text = |k: &str| plan.get(k).and_then(serde_json::Value::as_str);
        let mut label = text("Node Type").unwrap_or("?").to_owned();
        if let Some(index) = text("Index Name") {
            label = format!("{label} using {index}");
        } else if let Some(relation) = text("Relation Name") {
            label = format!("{label} on {relation}");
        }
        let children = plan
            .get("Plans")
            .and_then(serde_json::Value::as_array)
            .map(|ps| ps.iter().map(Node::parse).collect())
            .unwrap_or_default();
        Node {
            label,
            subplan: text("Subplan Name").map(str::to_owned),
            children,
        }
    }

    /// `Sort ← CTE Scan [CTE dbworker_candidates: LockRows ← Limit ← ...]`:
    /// each node with what it reads, subplans named.
    pub(crate) fn render(&self) -> String {
        let mut s = match &self.subplan {
            Some(name) => format!("{name}: {}", self.label),
            None => self.label.clone(),
        };
        match self.children.as_slice() {
            [] => {}
            [one] => {
                s.push_str(" ← ");
                s.push_str(&one.render());
            }
            many => {
                let parts: Vec<String> = many.iter().map(Node::render).collect();
                s.push_str(&format!(" ← [{}]", parts.join("; ")));
            }
        }
        s
    }

    fn find(&self, subplan: &str) -> Option<&Node> {
        if self.subplan.as_deref() == Some(subplan) {
            return Some(self);
        }
        self.children.iter().find_map(|c| c.find(subplan))
    }

    fn labels(&self) -> Vec<&str> {
        let mut all = vec![self.label.as_str()];
        for c in &self.children {
            all.extend(c.labels());
        }
        all
    }

    /// How the claim finds its rows: the index scans and any Sort in the
    /// candidates' subplan (the Sort above it orders the ≤ 10 claimed rows
    /// the statement returns, not the waiting ones).
    pub(crate) fn candidates(&self) -> String {
        let Some(candidates) = self.find("CTE dbworker_candidates") else {
            return "no dbworker_candidates subplan".to_owned();
        };
        let labels = candidates.labels();
        let scans: Vec<&str> = labels
            .iter()
            .copied()
            .filter(|l| l.contains("Scan"))
            .collect();
        let sorts = labels.iter().filter(|l| l.contains("Sort")).count();
        format!(
            "{}; {}",
            scans.join(", "),
            if sorts == 0 { "no Sort" } else { "a Sort" }
        )
    }
}

/// The claim's plans.
#[derive(Debug)]
pub(crate) struct Plans {
    /// `custom` or `generic`: the kind the sixth execution ran.
    pub(crate) chosen: &'static str,
    /// The plan the sixth execution ran.
    pub(crate) ran: Node,
    /// Its planning and execution time (EXPLAIN ANALYZE).
    pub(crate) times: (Duration, Duration),
    /// The other kind, forced with `plan_cache_mode`.
    pub(crate) other: Node,
}

/// The claim as the store's connection last sent it, if that was a claim:
/// `Some(Err)` when `track_activity_query_size` cut it short.
pub(crate) async fn claim_text(
    bench: &Bench,
) -> Result<Option<std::result::Result<String, String>>> {
    let row: Option<(String, i32)> = sqlx::query_as(
        r"SELECT query, (SELECT setting::int FROM pg_settings WHERE name = 'track_activity_query_size')
          FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()
            AND query ILIKE '%FOR UPDATE OF%SKIP LOCKED%' AND query NOT ILIKE '%pg_stat%'",
    )
    .fetch_optional(bench.admin())
    .await?;
    Ok(row.map(|(query, size)| {
        if query.len() + 1 >= usize::try_from(size).unwrap_or(0) {
            Err(format!(
                "the claim's text is cut at track_activity_query_size ({size} bytes)"
            ))
        } else {
            Ok(query)
        }
    }))
}

/// Prepares `sql`, runs it five times and explains the sixth execution with
/// ANALYZE (rolled back), then the other kind of plan without running it.
pub(crate) async fn explain(bench: &Bench, sql: &str) -> Result<Plans> {
    let mut conn = bench.admin().acquire().await?;
    sqlx::raw_sql(AssertSqlSafe(format!("PREPARE {NAME} AS {sql}")))
        .execute(&mut *conn)
        .await?;
    let plans = explain_prepared(&mut conn).await;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "RESET plan_cache_mode; DEALLOCATE {NAME}"
    )))
    .execute(&mut *conn)
    .await?;
    plans
}

async fn explain_prepared(conn: &mut PgConnection) -> Result<Plans> {
    let execute = execute_statement(conn).await?;
    let mut tx = conn.begin().await?;
    for _ in 0..5 {
        sqlx::raw_sql(AssertSqlSafe(execute.clone()))
            .execute(&mut *tx)
            .await?;
    }
    let analyzed = plan_json(
        &mut tx,
        &format!("EXPLAIN (ANALYZE, FORMAT JSON) {execute}"),
    )
    .await?;
    let generic: i64 =
        sqlx::query_scalar("SELECT generic_plans FROM pg_prepared_statements WHERE name = $1")
            .bind(NAME)
            .fetch_one(&mut *tx)
            .await?;
    tx.rollback().await?;
    let chosen = if generic > 0 { "generic" } else { "custom" };
    let other_mode = if generic > 0 { "custom" } else { "generic" };
    sqlx::raw_sql(AssertSqlSafe(format!(
        "SET plan_cache_mode = force_{other_mode}_plan"
    )))
    .execute(&mut *conn)
    .await?;
    let other = plan_json(conn, &format!("EXPLAIN (FORMAT JSON) {execute}")).await?;
    let ms = |k: &str| {
        Duration::from_secs_f64(
            analyzed
                .get(k)
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(0.0)
                / 1000.0,
        )
    };
    Ok(Plans {
        chosen,
        ran: Node::parse(&analyzed["Plan"]),
        times: (ms("Planning Time"), ms("Execution Time")),
        other: Node::parse(&other["Plan"]),
    })
}

/// `EXECUTE` of the prepared claim with a value for each parameter, by its
/// type: the claim's size for the integers (its LIMIT; the cursor's low id
/// on a plain table), a host name for the text.
async fn execute_statement(conn: &mut PgConnection) -> Result<String> {
    let types: Vec<String> = sqlx::query_scalar(
        "SELECT p.t::text FROM pg_prepared_statements AS s, unnest(s.parameter_types) WITH ORDINALITY AS p(t, n)
         WHERE s.name = $1 ORDER BY p.n",
    )
    .bind(NAME)
    .fetch_all(&mut *conn)
    .await?;
    let values = types
        .iter()
        .map(|t| match t.as_str() {
            "bigint" | "integer" | "smallint" => Ok(CLAIM_SIZE.to_string()),
            "text" | "character varying" => Ok("'explain'".to_owned()),
            other => Err(format!("the claim has a parameter of type {other}")),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(if values.is_empty() {
        format!("EXECUTE {NAME}")
    } else {
        format!("EXECUTE {NAME}({})", values.join(", "))
    })
}

/// The first (only) plan of an `EXPLAIN (FORMAT JSON)`.
async fn plan_json(conn: &mut PgConnection, explain: &str) -> Result<serde_json::Value> {
    let json: serde_json::Value = sqlx::query_scalar(AssertSqlSafe(explain.to_owned()))
        .fetch_one(&mut *conn)
        .await?;
    json.get(0)
        .cloned()
        .ok_or_else(|| format!("{explain} returned no plan").into())
}
