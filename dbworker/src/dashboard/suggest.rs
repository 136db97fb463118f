//! What the jobs page's search boxes suggest (`Admin::suggestions`), asked
//! of the database at most once a minute per table: a page that updates
//! itself every few seconds, in many tabs, must not ask each time.

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::admin::{Admin, Suggestions};
use crate::error::Result;

/// How long suggestions are reused before they are asked again.
const FRESH_FOR: Duration = Duration::from_secs(60);

/// One table's suggestions and when they were asked.
#[derive(Default)]
pub(crate) struct Suggested(Mutex<Option<(Instant, Suggestions)>>);

impl Suggested {
    /// The suggestions, asked of `admin` when none is younger than a minute.
    pub(crate) async fn get(&self, admin: &Admin) -> Result<Suggestions> {
        let mut cached = self.0.lock().await;
        if let Some((at, s)) = cached.as_ref()
            && at.elapsed() < FRESH_FOR
        {
            return Ok(s.clone());
        }
        let fresh = admin.suggestions().await?;
        *cached = Some((Instant::now(), fresh.clone()));
        Ok(fresh)
    }
}
