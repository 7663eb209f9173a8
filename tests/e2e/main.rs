//! The workspace's end-to-end suite: the built `dshdb` binary against DSH session logs.
//!
//! - `agent_log`: a DSH log written here (two closed turns and one a crash interrupted, with
//!   lone-surrogate escapes in the user's text): import, export byte for byte (plain and zstd),
//!   messages, repair, verify. Needs nothing outside the repository.
//! - `dsh_logs`: the same commands against DSH's oracle fixtures beside the repository
//!   (conformance; skipped with one line on stderr when they are missing, a failure under
//!   `CI=true`).
//!
//! Later suites (the Node provider, fleet mode) join as further modules.

mod agent_log;
mod dsh_logs;
