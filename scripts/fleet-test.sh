#!/usr/bin/env bash
# Fleet mode against real servers, alone: installs and starts tests/fleet/servers.sh
# (3 x nats-server 2.15.1 with sync_interval: always, s3s-fs 0.14.1, loopback, by pid), runs
# fleet/tests/real/servers.rs, and stops the servers by pid on any exit.
# scripts/test.sh does the same around the whole workspace test run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Bound of the test itself (it takes about 10 s here).
FLEET_TEST_TIMEOUT_SECONDS=300

bash tests/fleet/servers.sh start
trap 'bash tests/fleet/servers.sh stop' EXIT
eval "$(bash tests/fleet/servers.sh env)"
timeout "$FLEET_TEST_TIMEOUT_SECONDS" cargo test --release -p dshdb-fleet --test real servers:: -- --nocapture
