#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test of the workspace.
# Tests run in release mode because the crash-enumeration tests are heavy.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (release: the build scripts and proc macros it builds serve the tests too)"
cargo clippy --workspace --all-targets --release -- -D warnings

echo "== fleet test servers (tests/fleet/servers.sh: 3 x nats-server 2.15.1, s3s-fs 0.14.1, by pid)"
# fleet/tests/real/servers.rs runs against them (under CI=true it fails without them); they are
# stopped by pid on any exit.
bash tests/fleet/servers.sh start
trap 'bash tests/fleet/servers.sh stop' EXIT
eval "$(bash tests/fleet/servers.sh env)"

echo "== cargo test (release)"
cargo test --workspace --release
bash tests/fleet/servers.sh stop
trap - EXIT

echo "== Node provider (bindings/node: Node 22 from the npm registry, DSH's packages, node --test)"
bash bindings/node/scripts/test.sh
