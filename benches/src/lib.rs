//! Benchmarks for dshdb: a seeded DSH-shaped workload generator, the baselines (DSH JSONL,
//! DSH SQLite, raw `pwrite`+`fdatasync`) and the `compare` runner (`src/main.rs`).

pub mod baselines;
pub mod chart;
pub mod dsh_layout;
pub mod workload;
