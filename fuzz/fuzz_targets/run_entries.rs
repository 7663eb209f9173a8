#![no_main]
//! Fuzz target: see `dshdb::fuzzing::check_run_entries` for the property checked.

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    dshdb::fuzzing::check_run_entries(bytes);
});
