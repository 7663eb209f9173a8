//! Many processes on one store (format-spec/08-many-processes.md).
//!
//! What every writer process shares with the others on one host, over the `SHARED` file
//! ([`crate::storage::io::shared`]):
//! - [`lock`]: the fixed locks of F-08-3 (`OPEN`, `PRESENCE`, `WRITE`, `MANIFEST`,
//!   `MAINTENANCE`, `DURABLE`) as guards;
//! - [`lease`]: session leases (F-08-10), with the holder's pid for `SessionBusy`;
//! - [`tail`]: the shared tail index (F-08-5): where the published end of the log is, how far
//!   it is durable, generation counters for a cheap `refresh`, and the futex followers sleep
//!   on;
//! - [`repair`]: the decision table for a torn tail a dead writer left (F-08-9).

pub mod lease;
pub mod lock;
pub mod repair;
pub mod tail;

pub use crate::storage::io::shared::{LockMode, SharedFile, SHARED_FILE};
