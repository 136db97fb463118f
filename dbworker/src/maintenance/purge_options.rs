//! What the purger keeps and deletes, and how often: [`PurgeOptions`], read
//! from code or a config file.

use std::time::Duration;

use workerutil::JobState;

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::history::HistoryOptions;

/// What to purge from a job table, and how.
///
/// Deserializable from a config file: every field left out keeps its
/// default, durations are written as in [`workerutil::duration`], and an
/// unknown field is refused. `max_age` is a map from state to age,
/// `{ "completed": "7d", "failed": "30d" }`, which replaces the default
/// whole (a state it leaves out is kept).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct PurgeOptions {
    /// Final states to purge and how long after `finished_at` (database
    /// clock) a row of each goes. States not listed are kept. Default:
    /// completed after 7 days, failed and canceled after 30.
    #[serde(with = "max_age_map")]
    pub max_age: Vec<(JobState, Duration)>,
    /// Rows per statement: each batch is one short transaction, so the purger
    /// never holds many locks or a long snapshot. Default 1,000.
    pub chunk_size: u32,
    /// Move rows here instead of deleting them: a table with every column of
    /// the job table, in any order (`CREATE TABLE archive (LIKE jobs)`; rows
    /// are copied by column name, and [`Purger::new`](super::Purger::new)
    /// names each column it lacks). Default `None` (delete).
    pub archive_table: Option<String>,
    /// Time between passes of the purger's [`run`](crate::Service::run), spread by ±10 % so processes
    /// started together do not purge in step. Default 60 s.
    #[serde(with = "workerutil::duration")]
    pub interval: Duration,
    /// Partitioned tables only: each pass creates the partitions up to this
    /// many intervals past the current one (`<table>_create_partitions`), so
    /// new jobs never land in the default partition. Default 3.
    pub partitions_ahead: u32,
    /// Partitioned tables only: how long detaching a partition, or creating
    /// the partitions ahead, waits for the job table's lock before skipping
    /// it until the next pass (claims and enqueues queue behind a waiting
    /// detach or create, so keep it short). Default 1 s.
    #[serde(with = "workerutil::duration")]
    pub detach_lock_timeout: Duration,
    /// The [`History`](crate::history::History) recording this table, as it
    /// is configured (`"history": {}` in a file: its defaults). A finished
    /// row then goes only once the history has recorded its minute, so a
    /// `max_age` shorter than the history's `settle` plus its `interval`
    /// takes no job from the charts; a row older than the history's
    /// `catch_up` goes at its age (the history would never record it). The
    /// purger reads the history table (`SELECT`). Default `None`: rows go at
    /// their age, recorded or not.
    pub history: Option<HistoryOptions>,
}

/// `PurgeOptions::max_age` in a config file: a map from state to age, in
/// the order given; a state named twice is refused.
mod max_age_map {
    use std::fmt;
    use std::time::Duration;

    use serde::de::{Error as _, MapAccess, Visitor};
    use serde::ser::SerializeMap;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use workerutil::JobState;

    /// One age, written as `workerutil::duration` writes it.
    #[derive(Serialize, Deserialize)]
    #[serde(transparent)]
    struct Age(#[serde(with = "workerutil::duration")] Duration);

    pub(super) fn serialize<S: Serializer>(
        max_age: &[(JobState, Duration)],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(max_age.len()))?;
        for (state, age) in max_age {
            map.serialize_entry(state, &Age(*age))?;
        }
        map.end()
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<(JobState, Duration)>, D::Error> {
        deserializer.deserialize_map(MaxAge)
    }

    struct MaxAge;

    impl<'de> Visitor<'de> for MaxAge {
        type Value = Vec<(JobState, Duration)>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(r#"a map from final state to age, e.g. { "completed": "7d" }"#)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut max_age: Self::Value = Vec::new();
            while let Some((state, Age(age))) = map.next_entry::<JobState, Age>()? {
                if max_age.iter().any(|(s, _)| *s == state) {
                    return Err(A::Error::custom(format!("max_age names {state} twice")));
                }
                max_age.push((state, age));
            }
            Ok(max_age)
        }
    }
}

impl PurgeOptions {
    /// The defaults.
    pub fn new() -> Self {
        PurgeOptions::default()
    }

    /// Checks every field; the error names it.
    pub fn validate(&self) -> Result<()> {
        self.archive().map(|_| ())
    }

    /// The archive table, with every field checked.
    pub(crate) fn archive(&self) -> Result<Option<Relation>> {
        let invalid = |field: &'static str, reason: String| Error::InvalidOption { field, reason };
        for (state, _) in &self.max_age {
            if !state.is_final() {
                return Err(invalid(
                    "max_age",
                    format!("{state:?} is not a final state; only finished rows are purged"),
                ));
            }
        }
        for (_, age) in &self.max_age {
            Error::check_max_durations([("max_age", *age)])?;
        }
        if self.chunk_size == 0 {
            return Err(invalid("chunk_size", "must be at least 1".into()));
        }
        Error::check_max_durations([
            ("interval", self.interval),
            ("detach_lock_timeout", self.detach_lock_timeout),
        ])?;
        if self.interval.is_zero() {
            return Err(invalid("interval", "must be positive".into()));
        }
        if self.detach_lock_timeout < Duration::from_millis(1) {
            return Err(invalid(
                "detach_lock_timeout",
                "must be at least 1 ms (0 would wait forever)".into(),
            ));
        }
        if let Some(history) = &self.history {
            history.validate()?;
        }
        self.archive_table
            .as_deref()
            .map(|name| Relation::parse("archive_table", name))
            .transpose()
    }
}

impl Default for PurgeOptions {
    fn default() -> Self {
        const DAY: u64 = 24 * 3600;
        PurgeOptions {
            max_age: vec![
                (JobState::Completed, Duration::from_secs(7 * DAY)),
                (JobState::Failed, Duration::from_secs(30 * DAY)),
                (JobState::Canceled, Duration::from_secs(30 * DAY)),
            ],
            chunk_size: 1_000,
            archive_table: None,
            interval: Duration::from_secs(60),
            partitions_ahead: 3,
            detach_lock_timeout: Duration::from_secs(1),
            history: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_final_states_and_sane_sizes_are_accepted() {
        let mut o = PurgeOptions::new();
        assert!(o.validate().is_ok());
        o.max_age = vec![(JobState::Queued, Duration::from_secs(1))];
        assert!(o.validate().unwrap_err().to_string().contains("max_age"));
        let mut o = PurgeOptions::new();
        o.chunk_size = 0;
        assert!(o.validate().unwrap_err().to_string().contains("chunk_size"));
    }

    #[test]
    fn max_age_is_a_map_from_state_to_age_in_a_config_file() {
        let o: PurgeOptions = serde_json::from_str(
            r#"{ "max_age": { "completed": "1d", "failed": "2w" }, "chunk_size": 500 }"#,
        )
        .unwrap();
        const DAY: u64 = 24 * 3600;
        assert_eq!(
            o.max_age,
            [
                (JobState::Completed, Duration::from_secs(DAY)),
                (JobState::Failed, Duration::from_secs(14 * DAY)),
            ]
        );
        assert_eq!(o.chunk_size, 500);
        assert_eq!(o.interval, PurgeOptions::default().interval);
        let written = serde_json::to_string(&PurgeOptions::default()).unwrap();
        assert!(
            written.contains(
                r#""max_age":{"completed":"7days","failed":"30days","canceled":"30days"}"#
            ),
            "{written}"
        );
        let read: PurgeOptions = serde_json::from_str(&written).unwrap();
        assert_eq!(read.max_age, PurgeOptions::default().max_age);
        let refused = |text: &str| {
            serde_json::from_str::<PurgeOptions>(text)
                .unwrap_err()
                .to_string()
        };
        let e = refused(r#"{ "max_age": { "done": "1d" } }"#);
        assert!(e.starts_with("unknown variant `done`"), "{e}");
        let e = refused(r#"{ "max_age": { "failed": "1d", "failed": "2d" } }"#);
        assert!(e.starts_with("max_age names failed twice"), "{e}");
        // A state that is not final reads, and is refused where it is used.
        let o: PurgeOptions = serde_json::from_str(r#"{ "max_age": { "queued": "1d" } }"#).unwrap();
        assert!(o.validate().unwrap_err().to_string().contains("max_age"));
    }

    #[test]
    fn the_history_a_purge_waits_for_reads_from_a_config_file_and_is_checked() {
        let o: PurgeOptions =
            serde_json::from_str(r#"{ "history": { "catch_up": "2h" } }"#).unwrap();
        let history = o.history.as_ref().expect("the history's options");
        assert_eq!(history.catch_up, Duration::from_secs(7200));
        assert!(o.validate().is_ok());
        assert!(PurgeOptions::default().history.is_none());
        let o: PurgeOptions =
            serde_json::from_str(r#"{ "history": { "history_table": "no; drop" } }"#).unwrap();
        let e = o.validate().unwrap_err().to_string();
        assert!(e.contains("history_table"), "{e}");
    }
}
