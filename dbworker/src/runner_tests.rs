//! The runner on tokio's paused clock: every wait is exact.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::sync::{Arc, Mutex};

use workerutil::WakeupSender;

use super::*;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A service whose pass is the future its closure makes, in no span.
struct Script<F>(F);

impl<F, Fut> Pass for Script<F>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Next>,
{
    fn span(&self) -> tracing::Span {
        tracing::Span::none()
    }

    async fn pass(&mut self) -> Next {
        (self.0)().await
    }
}

/// Records when each pass starts (from `t0`) in `seen`; returns how many
/// have started.
fn record(seen: &RefCell<Vec<Duration>>, t0: Instant) -> usize {
    let mut seen = seen.borrow_mut();
    seen.push(t0.elapsed());
    seen.len()
}

/// Runs `runner` until `passes` have started; each pass takes `took` and
/// returns the next of `outcomes` (the last one repeats). Returns when each
/// pass started, from the run's start.
async fn starts(runner: Runner, passes: usize, took: Duration, outcomes: &[Next]) -> Vec<Duration> {
    let stop = CancellationToken::new();
    let t0 = Instant::now();
    let seen = RefCell::new(Vec::new());
    let mut service = Script(|| {
        let n = record(&seen, t0);
        if n == passes {
            stop.cancel();
        }
        let outcome = outcomes[(n - 1).min(outcomes.len() - 1)];
        async move {
            tokio::time::sleep(took).await;
            outcome
        }
    });
    runner.run(&stop, &mut service).await;
    seen.into_inner()
}

#[tokio::test(start_paused = true)]
async fn passes_are_an_interval_apart_from_the_end_or_from_the_start() {
    let every = || Runner::every(secs(10.0));
    let from_end = starts(every(), 3, secs(1.0), &[Next::Interval]).await;
    assert_eq!(from_end, [0.0, 11.0, 22.0].map(secs));
    let steady = starts(every().steady_rate(), 3, secs(1.0), &[Next::Interval]).await;
    assert_eq!(steady, [0.0, 10.0, 20.0].map(secs));

    // A pass longer than the interval: the next starts at once, and the
    // rate goes on from there.
    let stop = CancellationToken::new();
    let t0 = Instant::now();
    let seen = RefCell::new(Vec::new());
    let took = [secs(15.0), secs(1.0), secs(1.0)];
    let mut service = Script(|| {
        let n = record(&seen, t0);
        if n == 3 {
            stop.cancel();
        }
        async move {
            tokio::time::sleep(took[n - 1]).await;
            Next::Interval
        }
    });
    every().steady_rate().run(&stop, &mut service).await;
    assert_eq!(seen.into_inner(), [0.0, 15.0, 25.0].map(secs));
}

#[tokio::test(start_paused = true)]
async fn a_pass_can_set_the_next_wait_and_the_first_pass_can_wait() {
    let outcomes = [
        Next::After(secs(1.0)),
        Next::After(secs(2.0)),
        Next::Interval,
    ];
    let runner = Runner::every(secs(10.0)).first_after(secs(3.0));
    let seen = starts(runner, 4, Duration::ZERO, &outcomes).await;
    assert_eq!(seen, [3.0, 4.0, 6.0, 16.0].map(secs));

    // Counted from the start, as the claim cursor's probe paces itself.
    let runner = Runner::every(secs(10.0)).steady_rate();
    let seen = starts(runner, 2, secs(1.0), &[Next::After(secs(4.0))]).await;
    assert_eq!(seen, [0.0, 4.0].map(secs));
}

#[tokio::test(start_paused = true)]
async fn jitter_spreads_waits_within_its_bounds() {
    let runner = Runner::every(secs(10.0)).jitter(0.2);
    let seen = starts(runner, 200, Duration::ZERO, &[Next::Interval]).await;
    let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1] - w[0]).collect();
    for gap in &gaps {
        assert!(
            (secs(8.0)..=secs(12.0)).contains(gap),
            "{gap:?} is outside 10 s ± 20 %"
        );
    }
    let (low, high) = (gaps.iter().min().unwrap(), gaps.iter().max().unwrap());
    assert!(
        *low < secs(9.0) && *high > secs(11.0),
        "200 waits cover the range: {low:?}..{high:?}"
    );

    // Back-off waits are spread too, around their own length (8 s from the
    // third failure on).
    let runner = Runner::every(secs(1.0))
        .jitter(0.5)
        .backoff_up_to(secs(8.0));
    let seen = starts(runner, 50, Duration::ZERO, &[Next::BackOff]).await;
    for w in seen.windows(2).skip(2) {
        let gap = w[1] - w[0];
        assert!((secs(4.0)..=secs(12.0)).contains(&gap), "{gap:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_to_the_bound_and_a_success_brings_the_interval_back() {
    use Next::{BackOff, Interval};
    let outcomes = [
        BackOff, BackOff, BackOff, BackOff, Interval, BackOff, Interval, Interval,
    ];
    let runner = Runner::every(secs(1.0)).backoff_up_to(secs(5.0));
    let seen = starts(runner, outcomes.len() + 1, Duration::ZERO, &outcomes).await;
    let gaps: Vec<f64> = seen
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    assert_eq!(gaps, [2.0, 4.0, 5.0, 5.0, 1.0, 2.0, 1.0, 1.0]);

    // Without a bound, a failure waits the interval, as a success does.
    let seen = starts(Runner::every(secs(1.0)), 3, Duration::ZERO, &[BackOff]).await;
    assert_eq!(seen, [0.0, 1.0, 2.0].map(secs));
}

#[tokio::test(start_paused = true)]
async fn a_stop_ends_a_wait_at_once() {
    let stop = CancellationToken::new();
    let t0 = Instant::now();
    let passes = Cell::new(0);
    let count = || {
        passes.set(passes.get() + 1);
        async { Next::Interval }
    };
    let mut service = Script(count);
    let run = Runner::every(secs(10.0)).run(&stop, &mut service);
    let stopper = async {
        tokio::time::sleep(secs(3.5)).await;
        stop.cancel();
    };
    tokio::join!(run, stopper);
    assert_eq!((passes.get(), t0.elapsed()), (1, secs(3.5)));

    // An interval too long to add to the clock (a service meant to run
    // once) waits, jittered or not, without a panic.
    passes.set(0);
    let stop = CancellationToken::new();
    let run = Runner::every(Duration::MAX)
        .jitter(0.5)
        .run(&stop, &mut service);
    let stopper = async {
        tokio::time::sleep(secs(3600.0)).await;
        stop.cancel();
    };
    tokio::join!(run, stopper);
    assert_eq!(passes.get(), 1);

    // Before a delayed first pass: none runs.
    passes.set(0);
    let stopped = CancellationToken::new();
    stopped.cancel();
    Runner::every(secs(1.0))
        .first_after(secs(1.0))
        .run(&stopped, &mut Script(count))
        .await;
    assert_eq!(passes.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_stop_during_a_pass_lets_it_finish_or_abandons_it() {
    for abandon in [false, true] {
        let stop = CancellationToken::new();
        let t0 = Instant::now();
        let (started, finished) = (Cell::new(0), Cell::new(0));
        let mut runner = Runner::every(secs(1.0));
        if abandon {
            runner = runner.abandon_pass_on_stop();
        }
        let mut slow = Script(|| {
            started.set(started.get() + 1);
            async {
                tokio::time::sleep(secs(5.0)).await;
                finished.set(finished.get() + 1);
                Next::Interval
            }
        });
        let run = runner.run(&stop, &mut slow);
        let stopper = async {
            tokio::time::sleep(secs(2.0)).await;
            stop.cancel();
        };
        tokio::join!(run, stopper);
        let expected = if abandon {
            (1, 0, secs(2.0))
        } else {
            (1, 1, secs(5.0))
        };
        let seen = (started.get(), finished.get(), t0.elapsed());
        assert_eq!(seen, expected, "abandon: {abandon}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_wake_up_ends_a_wait_even_one_sent_during_the_pass() {
    let sender = WakeupSender::new();
    let stop = CancellationToken::new();
    let t0 = Instant::now();
    let seen = RefCell::new(Vec::new());
    let mut service = Script(|| {
        let n = record(&seen, t0);
        if n == 2 {
            // Arrives while this pass runs: the wait after it is cut short.
            sender.wake();
        }
        if n == 3 {
            stop.cancel();
        }
        async move {
            if n == 2 {
                tokio::time::sleep(secs(1.0)).await;
            }
            Next::Interval
        }
    });
    let run = Runner::every(secs(10.0))
        .woken_by(sender.subscribe())
        .run(&stop, &mut service);
    let waker = async {
        tokio::time::sleep(secs(4.0)).await;
        sender.wake();
    };
    tokio::join!(run, waker);
    assert_eq!(seen.into_inner(), [0.0, 4.0, 5.0].map(secs));
}

/// Three passes of half a second, each in a span named `purger`.
struct Named<'a> {
    stop: &'a CancellationToken,
    passes: usize,
}

impl Pass for Named<'_> {
    fn span(&self) -> tracing::Span {
        tracing::info_span!("purger", table = "jobs")
    }

    async fn pass(&mut self) -> Next {
        self.passes += 1;
        if self.passes == 3 {
            self.stop.cancel();
        }
        tokio::time::sleep(secs(0.5)).await;
        Next::Interval
    }
}

/// Counts the spans created, by name, and how often they are entered.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<(Vec<&'static str>, usize)>>);

impl tracing::Subscriber for Spans {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut spans = self.0.lock().unwrap();
        spans.0.push(span.metadata().name());
        tracing::span::Id::from_u64(spans.0.len() as u64)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {
        self.0.lock().unwrap().1 += 1;
    }
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test(start_paused = true)]
async fn each_pass_runs_in_a_span_named_by_the_service() {
    let spans = Spans::default();
    let _default = tracing::subscriber::set_default(spans.clone());
    let stop = CancellationToken::new();
    let mut service = Named {
        stop: &stop,
        passes: 0,
    };
    Runner::every(secs(1.0)).run(&stop, &mut service).await;
    let (names, entered) = spans.0.lock().unwrap().clone();
    assert_eq!(names, ["purger"; 3], "one span per pass");
    assert!(
        entered >= 6,
        "entered at each poll, twice a pass: {entered}"
    );
}
