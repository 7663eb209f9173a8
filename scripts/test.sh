#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test of the workspace.
# Tests run in release mode because the crash-enumeration tests are heavy.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "== cargo test (release)"
cargo test --workspace --release
