//! The in-memory store passes the conformance suite every store must pass.

use std::sync::Arc;

use workerutil::conformance::{self, Harness};
use workerutil::{
    ExecutionLogEntry, JobState, MemoryConditions, MemoryStore, MemoryStoreOptions, Record,
    RecordId,
};

#[derive(Debug, Clone)]
struct Rec(RecordId);

impl Record for Rec {
    fn id(&self) -> RecordId {
        self.0
    }
}

struct Memory;
impl Harness for Memory {
    type Store = MemoryStore<Rec>;

    async fn new_store(&self, max_num_retries: u32) -> Arc<MemoryStore<Rec>> {
        Arc::new(MemoryStore::new({
            let mut o = MemoryStoreOptions::default();
            o.max_num_retries = max_num_retries;
            o.max_num_resets = 1;
            o
        }))
    }

    async fn enqueue(&self, store: &MemoryStore<Rec>, n: usize) -> Vec<RecordId> {
        (1..=n as i64)
            .inspect(|&id| {
                assert!(store.enqueue(Rec(id)));
            })
            .collect()
    }

    async fn state(&self, store: &MemoryStore<Rec>, id: RecordId) -> JobState {
        store.state(id).expect("job exists")
    }

    async fn failure_message(&self, store: &MemoryStore<Rec>, id: RecordId) -> Option<String> {
        store.snapshot(id).expect("job exists").failure_message
    }

    async fn request_cancel(&self, store: &MemoryStore<Rec>, id: RecordId) {
        assert!(store.request_cancel(id));
    }

    async fn reset(&self, store: &MemoryStore<Rec>, id: RecordId) {
        store.reset(id).expect("job was processing");
    }

    fn only(&self, ids: &[RecordId]) -> MemoryConditions<Rec> {
        let ids = ids.to_vec();
        MemoryConditions::filter(move |r: &Rec| ids.contains(&r.0))
    }

    async fn execution_log(
        &self,
        store: &MemoryStore<Rec>,
        id: RecordId,
    ) -> Vec<ExecutionLogEntry> {
        store.snapshot(id).expect("job exists").execution_logs
    }
}

#[tokio::test]
async fn memory_store_passes_the_conformance_suite() {
    conformance::run_all(&Memory).await;
}
