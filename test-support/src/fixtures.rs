//! The DSH oracle fixtures in `shared/fixtures/dsh` beside the repository (or in
//! `$DSH_FIXTURES`). They are not part of the repository, so a fresh clone has none: every
//! test reading them starts with `if !present() { return; }`, which skips it after one line on
//! stderr (once per test binary), and fails it under `CI=true`, where the conformance suite
//! must run.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Once;

/// Overrides where the fixtures are looked for.
pub const DIRECTORY_VARIABLE: &str = "DSH_FIXTURES";

/// Where the fixtures are: `$DSH_FIXTURES`, else `shared/fixtures/dsh` beside the repository.
pub fn directory() -> PathBuf {
    match std::env::var_os(DIRECTORY_VARIABLE) {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/fixtures/dsh"
        )),
    }
}

/// Whether the environment says this is a CI run (`CI=true`, as CI services set it).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value.eq_ignore_ascii_case("true") || value == "1")
}

/// Whether the DSH oracle fixtures are there. Without them, the first call prints one line on
/// stderr naming what is skipped and why; under `CI=true` it panics instead.
pub fn present() -> bool {
    let directory = directory();
    if directory.join("README.md").is_file() {
        return true;
    }
    assert!(
        !in_ci(),
        "CI=true but the DSH oracle fixtures are missing at {}: the DSH conformance suite \
         must run in CI (set {DIRECTORY_VARIABLE} or put shared/fixtures/dsh beside the repository)",
        directory.display()
    );
    static NOTICE: Once = Once::new();
    NOTICE.call_once(|| {
        // Straight to the stream, past the test harness's capture: a skip must be visible.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: the DSH conformance tests of this suite (they compare with DSH's oracle \
             fixtures, which are not in the repository): no fixtures at {} (set \
             {DIRECTORY_VARIABLE}, or put shared/fixtures/dsh beside the repository; under \
             CI=true this is an error)",
            directory.display()
        );
    });
    false
}
