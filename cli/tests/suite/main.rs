//! The CLI's integration tests, as one test binary with one helper module (`common`): the
//! built `dshdb` binary against stores in scratch directories. The CLI against DSH logs
//! (import, repair, export, messages) is the workspace's end-to-end suite, `tests/e2e`.

mod common;

mod above;
mod cli;
mod damage;
mod hostile;
mod import;
mod usage;
