use dbworker_testkit::server;
use sqlx::{Connection, postgres::PgConnection, AssertSqlSafe};
use std::time::Instant;
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench() {
    let s = server().unwrap();
    let t = Instant::now();
    let mut c = PgConnection::connect(s.admin_url()).await.unwrap();
    eprintln!("connect: {:?}", t.elapsed());
    for strat in ["FILE_COPY", "FILE_COPY", "FILE_COPY", "WAL_LOG", "WAL_LOG"] {
        let t = Instant::now();
        for i in 0..4 {
            sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE x_{strat}_{i}_{} TEMPLATE template0 STRATEGY {strat}", t.elapsed().as_nanos()))).execute(&mut c).await.unwrap();
        }
        eprintln!("4x {strat}: {:?}", t.elapsed());
    }
}
