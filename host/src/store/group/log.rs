//! Flushing a store's log beside its lane rather than inside each commit.
//!
//! SQLite's `synchronous = FULL` flushes the log (`fsync`) inside every commit, and
//! the one writer waits: with commits a few milliseconds apart, the lane spent about a
//! third of its time there (see `docs/benchmarks.md`). Here the lane commits without a
//! flush and hands the answers of a batch that needs one to a thread of its own, which
//! flushes the log and then answers every batch handed over before the flush began.
//! One flush covers every commit before it, so it serves all the batches committed
//! while the last one ran, and the lane goes on writing meanwhile.
//!
//! This keeps the rule the group commit gives its callers: nobody is told that a write
//! needing power-loss durability is done before a flush that covers its commit. Other
//! connections may read such a commit before that flush, as they may read a commit of
//! progress that is never flushed alone; anything they do outside the database goes
//! through a write of their own that needs the flush ([`super::Durability::Full`]: a
//! claim before a provider call, a publish before an acceptance), and the log keeps a
//! prefix of its commits through a power loss, so that flush covers what they read.
//!
//! If a flush fails, what it covered may not be on disk, and the kernel may not say so
//! again on the next try: the writes waiting are answered with the error, and from then
//! on every write is refused before it runs (the gateway must be restarted, which
//! recovers the log from what is on disk), as PostgreSQL stops on a failed flush.

use super::super::StoreError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, OnceLock};

/// A write's answer, given once its batch's flush has ended (with its error, if any).
pub(super) type Answer = Box<dyn FnOnce(Option<&StoreError>) + Send>;

/// Flushes what the lane has committed: makes every commit that has returned durable.
pub(crate) type FlushFn = Box<dyn FnMut() -> std::io::Result<()> + Send>;

/// The thread that flushes the log, and the answers waiting for its next flush.
pub(super) struct LogFlush {
    waiting: Sender<Vec<Answer>>,
    failed: Arc<OnceLock<String>>,
    /// Flushes that succeeded (read by tests).
    #[cfg_attr(not(test), allow(dead_code))]
    flushes: Arc<AtomicU64>,
}

impl LogFlush {
    /// Starts the flushing thread, named `name`.
    pub(super) fn start(name: &str, flush: FlushFn) -> std::io::Result<Self> {
        let (waiting, rx) = channel();
        let failed = Arc::new(OnceLock::new());
        let flushes = Arc::new(AtomicU64::new(0));
        let (broken, count) = (failed.clone(), flushes.clone());
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || flushing(rx, flush, broken, count))?;
        Ok(Self {
            waiting,
            failed,
            flushes,
        })
    }

    /// Answers `answers` once a flush that began after this call has ended.
    pub(super) fn answer_after_flush(&self, answers: Vec<Answer>) {
        if let Err(back) = self.waiting.send(answers) {
            // The thread is gone (a panic in a flush): nothing says these commits, or
            // any after them, are durable.
            let _ = self.failed.set("the thread flushing it stopped".into());
            let e = self.refused().expect("just set");
            for answer in back.0 {
                answer(Some(&e));
            }
        }
    }

    /// Flushes that succeeded so far.
    #[cfg(test)]
    pub(super) fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Why every write is refused, once a flush has failed.
    pub(super) fn refused(&self) -> Option<StoreError> {
        self.failed.get().map(|e| refusal(e))
    }
}

fn refusal(e: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "the store could not flush its log to disk ({e}); restart the gateway"
    ))
}

/// The flushing thread: takes every batch of answers waiting, flushes once, answers
/// them; ends when the lane is gone and every answer given.
fn flushing(
    rx: Receiver<Vec<Answer>>,
    mut flush: FlushFn,
    failed: Arc<OnceLock<String>>,
    flushes: Arc<AtomicU64>,
) {
    while let Ok(mut answers) = rx.recv() {
        while let Ok(more) = rx.try_recv() {
            answers.extend(more);
        }
        let error = match failed.get() {
            Some(e) => Some(refusal(e)),
            None => flush().err().map(|e| {
                tracing::error!(
                    error = %e,
                    "flushing the store's log failed: every write is refused until the \
                     gateway is restarted"
                );
                let _ = failed.set(e.to_string());
                refusal(&e.to_string())
            }),
        };
        if error.is_none() {
            flushes.fetch_add(1, Ordering::Relaxed);
        }
        for answer in answers {
            answer(error.as_ref());
        }
    }
}
