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

echo "== Node provider (bindings/node: Node 22 from the npm registry, DSH's packages, node --test)"
bash bindings/node/scripts/test.sh
