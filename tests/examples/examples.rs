//! Runs every example as its own process: each asserts what it demonstrates
//! (every job completed once, the budget held, the killed worker's job came
//! back), so a broken example fails the suite. The last test runs them all
//! again with `DATABASE_URL` set, as `cargo test` may be run.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dbworker_testkit::ThrowawayServer;
use sqlx::Connection;

/// `target/<profile>/examples/NAME`, built by `cargo test` alongside this test.
fn example(name: &str) -> PathBuf {
    let mut dir = std::env::current_exe().expect("test binary path");
    dir.pop(); // the binary
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join("examples").join(name)
}

fn run(name: &str) -> String {
    run_with(name, &[])
}

fn run_with(name: &str, args: &[&str]) -> String {
    run_with_env(name, args, &[])
}

/// Runs example `name` with `args` and the variables `env` set; asserts that it
/// succeeded and returns its standard output.
fn run_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let path = example(name);
    assert!(
        path.exists(),
        "{} is missing; `cargo test` builds examples",
        path.display()
    );
    let mut child = Command::new(&path)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run example");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped")));
    // An example that hangs (a pool closed while connections are held, say)
    // fails here, naming itself, instead of stalling the whole suite.
    let deadline = Instant::now() + EXAMPLE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for example") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    let Some(status) = status else {
        panic!("{name} did not finish within {EXAMPLE_TIMEOUT:?}:\n{stdout}\n{stderr}");
    };
    assert!(status.success(), "{name} failed:\n{stdout}\n{stderr}");
    stdout
}

/// How long an example may run.
const EXAMPLE_TIMEOUT: Duration = Duration::from_secs(180);

#[test]
fn quickstart_runs_twenty_typed_jobs_each_once_in_plain_text() {
    let out = run("quickstart");
    assert!(out.contains("ran 20 jobs of kind \"square\""), "{out}");
    // `n` is the squares table's primary key: a job run twice would fail.
    assert!(out.contains("sum of squares 1..=20 = 2870"), "{out}");
    assert!(!out.contains('\x1b'), "no colour codes when piped:\n{out}");
}

#[test]
fn tour_completes_every_job_and_fails_the_malformed_one_naming_the_field() {
    let out = run("tour");
    assert!(out.contains("completed  20"), "{out}");
    assert!(out.contains("failed     1"), "{out}");
    assert!(
        out.contains(
            "job 21 failed: cannot read the arguments of kind \"square\" (at $.n): invalid type: string \"not a number\", expected i64"
        ),
        "{out}"
    );
    assert!(
        out.contains("execution logs with a finished step: 20"),
        "{out}"
    );
    assert!(out.contains("sum of squares 1..=20 = 2870"), "{out}");
    assert!(!out.contains('\x1b'), "no colour codes when piped:\n{out}");
}

#[test]
fn app_table_dequeues_by_repository_through_the_view() {
    let out = run("app_table");
    assert!(out.contains("processed in order (repository_id, job id): [(1, 2), (1, 4), (2, 3), (2, 6), (3, 1), (3, 5)]"), "{out}");
}

#[test]
fn budget_is_never_exceeded() {
    let out = run("budget");
    assert!(out.contains("40 jobs completed"), "{out}");
}

#[test]
fn resetter_process_brings_a_killed_workers_job_back() {
    let out = run("resetter_process");
    assert!(out.contains("the job is left processing"), "{out}");
    assert!(
        out.contains("after the resetter: queued, num_resets = 1"),
        "{out}"
    );
    assert!(
        out.contains("a new worker finished it: completed after 2 attempts"),
        "{out}"
    );
}

#[test]
fn enqueue_commits_with_the_order_debounces_by_key_and_runs_by_priority() {
    let out = run("enqueue");
    assert!(out.contains("sent in order: [\"p5 order 1 confirmed\", \"p1 cart digest v3\", \"p0 newsletter 1\", \"p0 newsletter 2\", \"p0 newsletter 3\"]"), "{out}");
    assert!(out.contains("still waiting: 1 (the reminder)"), "{out}");
}

#[test]
fn workflow_runs_a_diamond_and_a_retry_brings_a_canceled_task_back() {
    let out = run("workflow");
    assert!(out.contains("index: canceled"), "{out}");
    assert!(out.contains("after the retry: {\"completed\": 5}"), "{out}");
}

#[test]
fn prometheus_renders_the_worker_gauge_and_purger_series() {
    let out = run("prometheus");
    for line in [
        "workerutil_jobs_total{worker=\"prometheus-example\",outcome=\"completed\"} 20",
        "workerutil_jobs_total{worker=\"prometheus-example\",outcome=\"failed\"} 5",
        "workerutil_jobs_by_kind_total{kind=\"report\",outcome=\"poison\"} 5",
        "dbworker_queue_depth{table=\"jobs\",state=\"queued\",queue=\"default\"} 3",
        "dbworker_purged_total{table=\"jobs\",state=\"completed\"} 20",
        "dbworker_store_operations_total{store=\"jobs\",op=\"complete\",outcome=\"ok\"} 20",
        "dbworker_store_operation_seconds",
    ] {
        assert!(out.contains(line), "missing {line}:\n{out}");
    }
}

#[test]
fn opentelemetry_exports_one_trace_per_job_with_the_failure_as_its_status() {
    let out = run("opentelemetry");
    let spans: Vec<&str> = out.split("Span #").skip(1).collect();
    let jobs: Vec<&&str> = spans
        .iter()
        .filter(|s| s.contains("Name         : job"))
        .collect();
    assert_eq!(jobs.len(), 3, "{out}");
    let mut trace_ids = std::collections::HashSet::new();
    for job in &jobs {
        assert!(job.contains("ParentSpanId : None (root span)"), "{job}");
        assert!(
            job.contains("worker: String(Owned(\"otel-example\"))"),
            "{job}"
        );
        let trace = job.lines().find(|l| l.contains("TraceId      :")).unwrap();
        trace_ids.insert(trace.trim().to_owned());
    }
    assert_eq!(trace_ids.len(), 3, "one trace per job");
    let failed = jobs
        .iter()
        .find(|s| s.contains("outcome: String(Owned(\"failed\"))"))
        .expect("the failed job's span");
    assert!(failed.contains("Status       : Error"), "{failed}");
    assert!(
        failed.contains("no mail server for eve@mail.invalid"),
        "{failed}"
    );
    // The handler's own spans are children inside the jobs' traces.
    let sends = spans
        .iter()
        .filter(|s| s.contains("Name         : smtp_send"))
        .count();
    assert_eq!(sends, 3, "{out}");
}

#[test]
fn kinds_dispatch_by_kind_per_queue_and_fail_an_unknown_kind() {
    let out = run("kinds");
    assert!(
        out.contains("send_email    emails   completed   12"),
        "{out}"
    );
    assert!(
        out.contains("build_report  reports  completed    3"),
        "{out}"
    );
    assert!(
        out.contains(
            "send_sms      emails   failed       1 no handler is registered for kind \"send_sms\""
        ),
        "{out}"
    );
}

#[test]
fn cron_enqueues_each_tick_once_across_two_schedulers() {
    let out = run("cron");
    let line = out
        .lines()
        .find(|l| l.starts_with("enqueued by scheduler: "))
        .unwrap();
    let counts: Vec<usize> = line["enqueued by scheduler: ".len()..]
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .map(|n| n.parse().unwrap())
        .collect();
    let total: usize = counts.iter().sum();
    // 3.2 s of an every-second schedule: 3 or 4 ticks, each enqueued once.
    assert!((2..=4).contains(&total), "{out}");
    assert!(
        out.contains(&format!("jobs: {total}, completed: {total}")),
        "{out}"
    );
}

#[test]
fn consumers_keep_exactly_once_effects_across_a_sigkill() {
    let out = run("consumers");
    assert!(out.contains("killed the first child with SIGKILL"), "{out}");
    let after_kill: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("after the kill: "))
        .collect();
    assert_eq!(after_kill.len(), 2, "{out}");
    for line in after_kill {
        assert!(
            line.ends_with("committed effects match the checkpoint: yes"),
            "{out}"
        );
        assert!(!line.contains("checkpoint 3000,"), "killed mid-way: {out}");
    }
    for consumer in ["audit", "totals"] {
        assert!(
            out.contains(&format!(
                "at the end: {consumer}: checkpoint 3000, rows 3000, distinct positions 3000"
            )),
            "{out}"
        );
    }
}

#[test]
fn cluster_node_runs_jobs_consumers_and_the_leaders_resetter() {
    let out = run("cluster_node");
    assert!(out.lines().any(|l| l.starts_with("leader ")), "{out}");
    assert!(
        out.contains(
            "jobs completed: 200, effects: 200 (200 distinct), projected events: 1200 (4 consumers)"
        ),
        "{out}"
    );
}

#[test]
fn dashboard_is_mounted_in_an_application_behind_a_token() {
    let out = run_with("dashboard", &["--check"]);
    for path in [
        "/admin/jobs",
        "/admin/jobs/t/jobs/jobs?state=queued",
        "/admin/jobs/t/jobs/queues",
    ] {
        assert!(out.contains(&format!("GET {path} -> 200 OK")), "{out}");
    }
    assert!(
        out.contains("GET /admin/jobs without the token -> 401 Unauthorized"),
        "{out}"
    );
}

/// Every example with its arguments, for the `DATABASE_URL` run.
const EXAMPLES: [(&str, &[&str]); 14] = [
    ("quickstart", &[]),
    ("tour", &[]),
    ("app_table", &[]),
    ("budget", &[]),
    ("resetter_process", &[]),
    ("enqueue", &[]),
    ("prometheus", &[]),
    ("opentelemetry", &[]),
    ("kinds", &[]),
    ("cron", &[]),
    ("consumers", &[]),
    ("cluster_node", &[]),
    ("dashboard", &["--check"]),
    ("workflow", &[]),
];

/// With `DATABASE_URL` set, every example makes its scratch database on that
/// server, like the testkit (and `cargo test`) does; none takes the URL for a
/// database of its own. CI runs without `DATABASE_URL`, so this test points
/// the examples at a server of its own: each must succeed there, and each
/// must have used it, which the server's count of sessions on its maintenance
/// database shows (creating the scratch database takes one, dropping it
/// another).
#[test]
fn every_example_makes_its_scratch_database_on_the_database_url_server() {
    let server =
        ThrowawayServer::start(&["fsync=off", "synchronous_commit=off"]).expect("throwaway server");
    let url = server.admin_url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Open before the examples run: a session is counted when it ends.
    let mut stats = runtime
        .block_on(sqlx::PgConnection::connect(url))
        .expect("connect to the server");
    let sessions = |stats: &mut sqlx::PgConnection| -> i64 {
        runtime
            .block_on(
                sqlx::query_scalar(
                    "SELECT sessions FROM pg_stat_database WHERE datname = current_database()",
                )
                .fetch_one(stats),
            )
            .expect("session count")
    };
    let before = sessions(&mut stats);

    // Two at a time, like the test harness on a small machine.
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                while let Some((name, args)) = EXAMPLES.get(next.fetch_add(1, Ordering::Relaxed)) {
                    run_with_env(name, args, &[("DATABASE_URL", url)]);
                }
            });
        }
    });

    // The examples' sessions are counted as their backends exit, just after.
    let expected = before + 2 * i64::try_from(EXAMPLES.len()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut counted = sessions(&mut stats);
    while counted < expected && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        counted = sessions(&mut stats);
    }
    assert!(
        counted >= expected,
        "{} sessions on {url} for {} examples; one of them did not make its database there",
        counted - before,
        EXAMPLES.len()
    );
    let left: i64 = runtime
        .block_on(
            sqlx::query_scalar(
                "SELECT count(*) FROM pg_database WHERE datname LIKE 'dbworker\\_test\\_%'",
            )
            .fetch_one(&mut stats),
        )
        .unwrap();
    assert_eq!(left, 0, "every example drops its scratch database");
    let _ = runtime.block_on(stats.close());
}

/// Every example through PgBouncer in transaction mode
/// (`DBWORKER_POOLER=transaction`), three server connections shared by all
/// of an example's client connections, so a statement prepared under a name
/// by one client meets another's of the same name: each must succeed, its
/// migrations run on a direct connection (`TestDatabase::migrate`) and
/// everything else through the pooler (`TestDatabase::pool`).
#[test]
fn every_example_runs_through_pgbouncer_in_transaction_mode() {
    let binary = match dbworker_testkit::pgbouncer::find() {
        Ok(binary) => binary,
        Err(reason) => {
            dbworker_testkit::skip("the examples through PgBouncer", &reason);
            return;
        }
    };
    let server =
        ThrowawayServer::start(&["fsync=off", "synchronous_commit=off"]).expect("throwaway server");
    let bouncer = dbworker_testkit::pgbouncer::Bouncer::start_for_any_database(
        &binary,
        server.admin_url(),
        3,
    );
    let address = bouncer.address();
    let env = [
        ("DATABASE_URL", server.admin_url()),
        ("DBWORKER_TEST_PGBOUNCER", address.as_str()),
        ("DBWORKER_POOLER", "transaction"),
    ];
    // Two at a time, like the test harness on a small machine.
    let outputs = std::sync::Mutex::new(std::collections::HashMap::new());
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                while let Some((name, args)) = EXAMPLES.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let out = run_with_env(name, args, &env);
                    outputs.lock().unwrap().insert(*name, out);
                }
            });
        }
    });
    let outputs = outputs.into_inner().unwrap();
    let quickstart = &outputs["quickstart"];
    assert!(
        quickstart.contains("sum of squares 1..=20 = 2870"),
        "{quickstart}"
    );
    let tour = &outputs["tour"];
    assert!(tour.contains("completed  20"), "{tour}");
    assert!(tour.contains("sum of squares 1..=20 = 2870"), "{tour}");
}
