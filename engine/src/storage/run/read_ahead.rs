//! Read-ahead for scans over whole runs: a worker thread decompresses the block after the
//! one a scan is reading, so that on a machine with a second core a cold resume or an
//! export spends its own thread on parsing while zstd runs beside it. Only scans that read
//! block after block use it (`store::ReadScan`); a short read never starts a thread.

use super::{decode_block_into, BlockKey, RunReader};
use crate::error::{Error, Result};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A block for the worker to decompress, with a buffer to decompress it into.
struct Request {
    reader: Arc<RunReader>,
    block: usize,
    buffer: Vec<u8>,
}

/// A decompressed block, or why it could not be.
type Answer = (BlockKey, Result<Vec<u8>>);

/// The worker and the one block it is decompressing (at most one: the next).
pub struct ReadAhead {
    requests: Option<Sender<Request>>,
    answers: Receiver<Answer>,
    worker: Option<JoinHandle<()>>,
    pending: Option<BlockKey>,
}

impl ReadAhead {
    /// Starts the worker thread; `None` when the system refuses a thread (the scan then
    /// decompresses everything itself).
    pub fn start() -> Option<ReadAhead> {
        let (requests, inbox) = channel::<Request>();
        let (outbox, answers) = channel::<Answer>();
        let worker = std::thread::Builder::new()
            .name("dshdb-read-ahead".to_string())
            .spawn(move || serve(inbox, outbox))
            .ok()?;
        Some(ReadAhead {
            requests: Some(requests),
            answers,
            worker: Some(worker),
            pending: None,
        })
    }

    /// The block `key` if it is the one being read ahead (waiting for it), else `None`
    /// (a block read ahead and not wanted is dropped).
    pub fn take(&mut self, key: BlockKey) -> Option<Result<Vec<u8>>> {
        let pending = self.pending.take()?;
        let (answered, outcome) = self.answers.recv().ok()?;
        (pending == key && answered == key).then_some(outcome)
    }

    /// Asks the worker for the block after `block` of `reader`, if the run has one.
    pub fn ask_next(&mut self, reader: &Arc<RunReader>, block: usize, buffer: Vec<u8>) {
        let next = block + 1;
        let Some(requests) = &self.requests else {
            return;
        };
        if self.pending.is_some() || next >= reader.index.blocks.len() {
            return;
        }
        let request = Request {
            reader: reader.clone(),
            block: next,
            buffer,
        };
        if requests.send(request).is_ok() {
            self.pending = Some((reader.index.id, next));
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // Closing the request channel ends the worker once its block is done.
        self.requests = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// The worker: decompresses each requested block with one zstd context.
fn serve(inbox: Receiver<Request>, outbox: Sender<Answer>) {
    let mut decompressor = match zstd::bulk::Decompressor::new() {
        Ok(decompressor) => decompressor,
        Err(error) => {
            // Every request gets the error; the scan reports it for the block it wanted.
            for request in inbox {
                let key = (request.reader.index.id, request.block);
                let failure = Error::io(
                    "run block decompressor",
                    std::io::Error::new(error.kind(), error.to_string()),
                );
                if outbox.send((key, Err(failure))).is_err() {
                    return;
                }
            }
            return;
        }
    };
    for request in inbox {
        let Request {
            reader,
            block,
            mut buffer,
        } = request;
        let entry = &reader.index.blocks[block];
        let outcome = reader
            .with_stored(block, |stored| {
                decode_block_into(
                    stored,
                    entry,
                    reader.index.id,
                    &mut decompressor,
                    &mut buffer,
                )
            })
            .map(|()| buffer);
        if outbox.send(((reader.index.id, block), outcome)).is_err() {
            return;
        }
    }
}
