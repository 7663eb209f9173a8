//! The engine's integration tests, as one test binary (one link, one process to start) with
//! one shared helper module, `common`. Run one part with a module filter, e.g.
//! `cargo test --release -p dshdb --test suite crash::`.
//!
//! The DSH conformance parts (`session_fixtures`, `exchange_fixtures`, and the fixture cases
//! of several others) read DSH's oracle fixtures from `shared/fixtures/dsh` beside the
//! repository; without them they are skipped with one line on stderr, and under `CI=true`
//! their absence fails (`common::dsh_fixtures`).

mod common;

mod above_properties;
mod binding_support;
mod bitflip;
mod canonical_json;
mod cold_resume;
mod compaction;
mod crash;
mod exchange_fixtures;
mod faults;
mod format_vectors;
mod format_vectors_07;
mod fuzz_replay;
mod hostile_input;
mod hostile_open;
mod kill;
mod kill_processes;
mod open_prefix;
mod processes;
mod projection_cache;
mod readers;
mod recovery_table;
mod retention;
mod run_rows;
mod run_vectors;
mod runs;
mod session_fixtures;
mod shared_maintenance;
mod shared_open;
mod spill;
mod sqlite_import;
mod store_basics;
mod streaming_import;
