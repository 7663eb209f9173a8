//! Durability receipts settled off the JavaScript thread.
//!
//! An append is submitted to the engine's group commit on the JavaScript thread (encoding
//! only, no I/O) and its receipt goes to one receipt thread owned by the binding, which
//! waits for the commit and settles the append's promise from there. So no fsync ever
//! parks the event loop or a libuv worker, and every batch submitted before the committer's
//! next round shares its fsync, whichever sessions they belong to. Receipts complete in
//! submission order, so one thread waiting for them in turn adds no latency.

use dshdb::PendingReceipt;
use napi::bindgen_prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Sender};
use std::thread::JoinHandle;

/// Settles an append's promise (with no value) from any thread.
pub type Settle = napi::JsDeferred<(), fn(Env) -> Result<()>>;

fn resolved(_: Env) -> Result<()> {
    Ok(())
}

/// What the receipt thread waits for before it settles a promise.
pub enum Job {
    /// A batch in the engine's commit queue.
    Receipt(PendingReceipt, Settle),
    /// A test hook: the wait panics, which must reject the promise, not end the process.
    Panic(Settle),
}

pub struct ReceiptThread {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl ReceiptThread {
    pub fn start() -> std::io::Result<ReceiptThread> {
        let (jobs, queue) = channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("dshdb-node-receipts".to_string())
            .spawn(move || {
                for job in queue {
                    run(job);
                }
            })?;
        Ok(ReceiptThread {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Queues a job; a job that cannot be queued (the thread is gone) is settled here.
    pub fn send(&self, job: Job) {
        let Some(jobs) = &self.jobs else {
            reject_job(job, "the store is closed");
            return;
        };
        if let Err(failed) = jobs.send(job) {
            reject_job(failed.0, "the receipt thread has stopped");
        }
    }

    /// Stops the thread once every job queued so far is settled.
    pub fn stop(&mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for ReceiptThread {
    fn drop(&mut self) {
        self.stop();
    }
}

fn reject_job(job: Job, reason: &str) {
    match job {
        Job::Receipt(_, settle) | Job::Panic(settle) => {
            settle.reject(Error::new(Status::GenericFailure, reason.to_string()))
        }
    }
}

fn run(job: Job) {
    match job {
        Job::Receipt(receipt, settle) => {
            let waited = catch_unwind(AssertUnwindSafe(|| receipt.wait()));
            settle_with(settle, waited.map(|outcome| outcome.map(|_| ())));
        }
        Job::Panic(settle) => {
            let waited: std::thread::Result<dshdb::Result<()>> =
                catch_unwind(|| panic!("dshdb-node test hook: panic on the receipt thread"));
            settle_with(settle, waited);
        }
    }
}

fn settle_with(settle: Settle, waited: std::thread::Result<dshdb::Result<()>>) {
    match waited {
        Ok(Ok(())) => settle.resolve(resolved),
        Ok(Err(error)) => settle.reject(crate::engine_error(&error)),
        Err(panic) => settle.reject(crate::panic_error(panic.as_ref())),
    }
}
