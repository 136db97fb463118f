//! Quickstart: a typed job, enqueued and run by a client, its handler writing
//! in the job's transaction. Needs no set-up: with `DATABASE_URL` unset it
//! starts a throwaway PostgreSQL cluster. The crate's front page explains
//! each piece.

use dbworker::prelude::*;

/// A job's arguments: JSON in the `payload` column, `"square"` in `kind`.
#[derive(serde::Serialize, serde::Deserialize)]
struct Square {
    n: i64,
}

impl JobArgs for Square {
    const KIND: &'static str = "square";
}

/// Stores n² in the job's transaction: it commits with the job's completion.
struct Squarer;

impl JobHandler for Squarer {
    type Args = Square;

    async fn handle(&self, mut job: Job<'_, Square>) -> Result<(), HandlerError> {
        // Unnamed (`persistent(false)`), so it also runs behind PgBouncer.
        sqlx::query("INSERT INTO squares VALUES ($1, $1 * $1)")
            .bind(job.args.n)
            .persistent(false)
            .execute(job.tx()?)
            .await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = dbworker_testkit::TestDatabase::new().await?; // a throwaway cluster, or DATABASE_URL
    let pool = db.pool(10).await?;
    // `example_jobs` (with `kind`, `payload`) and `squares`, on a direct connection: a
    // migration keeps a session lock, which a pooler in transaction mode would not.
    db.migrate(&sqlx::migrate!("./migrations")).await?;

    // The job table, checked once; the client enqueues into it and runs its jobs.
    let jobs = JobTable::new(&pool, JobTableOptions::typed("example_jobs")).await?;
    let client = Client::builder(&pool, &jobs)
        .handler(Squarer)
        .build()
        .await?;
    client.enqueue_many((1..=20).map(|n| Square { n })).await?;
    let summary = client.run_until_empty().await?; // no job left: every part stops
    println!("ran {} jobs of kind \"square\"", summary.dequeued);

    // Unnamed, in a transaction of its own: what a statement behind PgBouncer needs.
    let sum: i64 = sqlx::query_scalar("SELECT sum(square)::bigint FROM squares")
        .persistent(false)
        .fetch_one(&mut *pool.begin().await?)
        .await?;
    println!("sum of squares 1..=20 = {sum}");
    Ok(())
}
