//! What the multi-process fleet tests share: the servers' variables (skip without them,
//! fail under `CI=true`), node processes torn down by pid however a test ends, a client of
//! the nodes' JSON-lines protocol, a router that follows `moved` answers, a model of what
//! was sent and acknowledged per session, and the servers script for faults.

#![allow(dead_code, clippy::unwrap_used)]

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Lease TTL of the test fleets.
pub const NODE_TTL: Duration = Duration::from_secs(2);
/// Pause between a node's lease refreshes and takeover rounds.
pub const TICK: Duration = Duration::from_millis(300);
/// Longest wait for a node to listen, or for a session to find an owner.
pub const SETUP_DEADLINE: Duration = Duration::from_secs(30);
/// Longest wait for one reply from a node.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(15);
/// Pause between polls of a condition.
pub const POLL: Duration = Duration::from_millis(100);

/// The servers' turn: one test at a time uses them (they kill, stop and restart servers,
/// and load the machine), though the harness runs the binary's tests on several threads.
static SERVERS_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A test's hold on the servers, from [`servers_present`] to the end of the test.
pub struct ServersTurn {
    _held: std::sync::MutexGuard<'static, ()>,
}

/// The servers' turn when they are there: `None` (after a SKIPPED line) when they are not;
/// panics under `CI=true`, where a missing server must fail the run. Waits while another
/// test holds the turn (a test that panicked gives it up like one that passed).
pub fn servers_present(test: &str) -> Option<ServersTurn> {
    if std::env::var("DSHDB_FLEET_SERVERS").as_deref() == Ok("1") {
        let held = SERVERS_TURN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        return Some(ServersTurn { _held: held });
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but DSHDB_FLEET_SERVERS is not set: start tests/fleet/servers.sh"
    );
    eprintln!("SKIPPED {test}: DSHDB_FLEET_SERVERS is not set");
    None
}

/// A token unique to this run, so that reruns against the same servers do not collide.
pub fn run_token() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    )
}

pub fn nats_config() -> dshdb_fleet::nats::NatsConfig {
    dshdb_fleet::nats::NatsConfig {
        urls: std::env::var("DSHDB_FLEET_NATS").unwrap(),
        replicas: 3,
        node_ttl: NODE_TTL,
    }
}

pub fn s3_config() -> dshdb_fleet::s3::S3Config {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    dshdb_fleet::s3::S3Config {
        endpoint: var("DSHDB_FLEET_S3_ENDPOINT"),
        bucket: var("DSHDB_FLEET_S3_BUCKET"),
        region: "us-east-1".to_string(),
        access_key: var("DSHDB_FLEET_S3_ACCESS_KEY"),
        secret_key: var("DSHDB_FLEET_S3_SECRET_KEY"),
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A runtime with two worker threads, for tests whose nodes run concurrently with their
/// clients (one per core of the test machines).
pub fn two_worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Creates the streams and buckets before the nodes start, so that they start together.
pub fn set_up_streams(runtime: &tokio::runtime::Runtime) -> dshdb_fleet::nats::Nats {
    runtime
        .block_on(dshdb_fleet::nats::Nats::connect(&nats_config()))
        .unwrap()
}

/// Node processes; every one still running is killed (by pid) when the test ends.
pub struct Fleet {
    pub children: Vec<Option<Child>>,
    pub ids: Vec<String>,
    pub addrs: Vec<String>,
    pub stores: Vec<PathBuf>,
    shards: u32,
    ttl: Duration,
    /// More `dshdb-fleet-node` arguments (a durability mode, a degrade policy).
    pub extra_args: Vec<String>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A passing test's node stores are of no further use (F9's take hundreds of MB
        // each); a failing test's stay for the post-mortem.
        if !std::thread::panicking() {
            for store in &self.stores {
                let _ = std::fs::remove_dir_all(store);
            }
        }
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

impl Fleet {
    /// Starts `nodes` node processes named `<prefix>N x<token>`, each with an empty store.
    pub fn spawn(prefix: &str, token: &str, nodes: usize, shards: u32) -> Fleet {
        Fleet::spawn_with_ttl(prefix, token, nodes, shards, NODE_TTL)
    }

    /// As [`Fleet::spawn`], with lease TTL `ttl`.
    pub fn spawn_with_ttl(
        prefix: &str,
        token: &str,
        nodes: usize,
        shards: u32,
        ttl: Duration,
    ) -> Fleet {
        Fleet::spawn_with_args(prefix, token, nodes, shards, ttl, &[])
    }

    /// As [`Fleet::spawn_with_ttl`], each node started with `extra_args` more.
    pub fn spawn_with_args(
        prefix: &str,
        token: &str,
        nodes: usize,
        shards: u32,
        ttl: Duration,
        extra_args: &[&str],
    ) -> Fleet {
        let mut fleet = Fleet {
            children: Vec::new(),
            ids: Vec::new(),
            addrs: Vec::new(),
            stores: Vec::new(),
            shards,
            ttl,
            extra_args: extra_args.iter().map(|arg| arg.to_string()).collect(),
        };
        for index in 1..=nodes {
            let id = format!("{prefix}{index}x{token}");
            let store = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fleet-{id}"));
            let _ = std::fs::remove_dir_all(&store);
            fleet.ids.push(id);
            fleet.stores.push(store);
            fleet.addrs.push(String::new());
            fleet.children.push(None);
            fleet.start(index - 1);
        }
        for addr in &fleet.addrs {
            wait_listening(addr);
        }
        fleet
    }

    /// Starts node `index` (again, on the store it had), on a new port.
    pub fn start(&mut self, index: usize) {
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_dshdb-fleet-node"))
            .args(["--id", &self.ids[index], "--listen", &addr])
            .arg("--store")
            .arg(&self.stores[index])
            .args(["--ttl-ms", &self.ttl.as_millis().to_string()])
            .args(["--tick-ms", &TICK.as_millis().to_string()])
            .args(["--shards", &self.shards.to_string()])
            .args(&self.extra_args)
            // Test nodes answer the test hooks (the `stall` request).
            .env(dshdb_fleet::serve::TEST_HOOKS_VARIABLE, "1")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        self.children[index] = Some(child);
        self.addrs[index] = addr;
    }

    pub fn pid(&self, index: usize) -> u32 {
        self.children[index].as_ref().unwrap().id()
    }

    /// Sends `signal` (a `kill -s` name: STOP, CONT, KILL) to node `index`.
    pub fn signal(&self, index: usize, signal: &str) {
        let status = Command::new("kill")
            .args(["-s", signal, &self.pid(index).to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -s {signal} failed");
    }

    /// `kill -9` of node `index`, waiting for it to be gone.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.children[index].take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// A router over every node but those in `without` (stopped or killed ones).
    pub fn router_without(&self, without: &[usize]) -> Router {
        let mut router = self.router();
        for index in without {
            let id = &self.ids[*index];
            router.addrs.remove(id);
            router.order.retain(|other| other != id);
        }
        router
    }

    /// The shards the nodes other than `without` own together.
    pub fn shards_owned_by_others(&self, without: usize) -> BTreeSet<u32> {
        (0..self.ids.len())
            .filter(|index| *index != without && self.children[*index].is_some())
            .flat_map(|index| self.owned_shards(index))
            .collect()
    }

    /// Waits until every shard is owned by its rendezvous owner among the live nodes (as
    /// opposed to merely owned: the first node to register takes every shard, and hands
    /// them on as the others register). Tests that queue work on an owner (seals) need the
    /// shards to stay put afterwards.
    pub fn wait_ownership_settled(&self, deadline: Duration) -> Duration {
        let live: Vec<usize> = (0..self.ids.len())
            .filter(|index| self.children[*index].is_some())
            .collect();
        let mut names: Vec<String> = live.iter().map(|index| self.ids[*index].clone()).collect();
        names.sort();
        wait_until("every shard is on its rendezvous owner", deadline, || {
            live.iter().all(|index| {
                let expected: BTreeSet<u32> = (0..self.shards)
                    .filter(|shard| {
                        dshdb_fleet::shard::rendezvous_owner(*shard, &names)
                            == Some(&self.ids[*index])
                    })
                    .collect();
                self.owned_shards(*index) == expected
            })
        })
    }

    pub fn router(&self) -> Router {
        Router {
            addrs: self
                .ids
                .iter()
                .cloned()
                .zip(self.addrs.iter().cloned())
                .collect(),
            order: self.ids.clone(),
            clients: HashMap::new(),
            owner_of: HashMap::new(),
        }
    }

    /// Node `index`'s status answer (see `fleet/src/serve.rs`).
    pub fn status(&self, index: usize) -> Value {
        let mut client = Client::connect(&self.addrs[index]).unwrap();
        let reply = client.call(&json!({"op": "status"})).unwrap();
        assert_eq!(reply["ok"], json!(true), "status: {reply}");
        reply
    }

    pub fn owned_shards(&self, index: usize) -> BTreeSet<u32> {
        self.status(index)["owned_shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|shard| u32::try_from(shard.as_u64().unwrap()).unwrap())
            .collect()
    }

    pub fn metric(&self, index: usize, name: &str) -> u64 {
        self.status(index)["metrics"][name].as_u64().unwrap()
    }
}

pub fn wait_listening(addr: &str) {
    let started = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(started.elapsed() < SETUP_DEADLINE, "{addr} never listened");
        std::thread::sleep(POLL);
    }
}

/// Polls `condition` every [`POLL`] until it holds; panics naming `what` after `deadline`.
pub fn wait_until(what: &str, deadline: Duration, mut condition: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < deadline,
            "{what}: not after {deadline:?}"
        );
        std::thread::sleep(POLL);
    }
    started.elapsed()
}

/// One request-reply connection to a node.
pub struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    pub fn connect(addr: &str) -> std::io::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
        Ok(Client {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Sends a request without waiting for its reply.
    pub fn send(&mut self, request: &Value) -> std::io::Result<()> {
        let mut line = request.to_string();
        line.push('\n');
        self.writer.write_all(line.as_bytes())
    }

    /// The next reply, or `None` when the connection failed.
    pub fn receive(&mut self) -> Option<Value> {
        let mut reply = String::new();
        match self.reader.read_line(&mut reply) {
            Ok(0) | Err(_) => None,
            Ok(_) => serde_json::from_str(&reply).ok(),
        }
    }

    /// The reply, or `None` when the connection failed (the outcome is unknown).
    pub fn call(&mut self, request: &Value) -> Option<Value> {
        self.send(request).ok()?;
        self.receive()
    }
}

/// Routes requests to sessions' owners, following `moved` answers.
pub struct Router {
    pub addrs: HashMap<String, String>,
    pub order: Vec<String>,
    pub clients: HashMap<String, Client>,
    pub owner_of: HashMap<String, String>,
}

pub enum Outcome {
    Ok(Value),
    /// No answer (connection lost): the write may or may not have happened.
    Unknown,
    /// Refused with a definitive error (no owner yet, moved without a live owner, …).
    Refused(String),
}

impl Router {
    fn client(&mut self, id: &str) -> Option<&mut Client> {
        if !self.clients.contains_key(id) {
            let client = Client::connect(self.addrs.get(id)?).ok()?;
            self.clients.insert(id.to_string(), client);
        }
        self.clients.get_mut(id)
    }

    fn candidates(&self, session: &str) -> Vec<String> {
        let mut list: Vec<String> = self.owner_of.get(session).cloned().into_iter().collect();
        list.extend(self.order.iter().cloned());
        list
    }

    pub fn call(&mut self, session: &str, request: &Value) -> Outcome {
        let mut last = String::from("no node answered");
        for id in self.candidates(session) {
            let Some(client) = self.client(&id) else {
                continue;
            };
            let Some(reply) = client.call(request) else {
                self.clients.remove(&id);
                return Outcome::Unknown;
            };
            if reply["ok"] == json!(true) {
                self.owner_of.insert(session.to_string(), id);
                return Outcome::Ok(reply);
            }
            last = reply["error"].as_str().unwrap_or("?").to_string();
            if reply["moved"] == json!(true) {
                if let Some(owner) = reply["owner"].as_str() {
                    if owner != id && self.addrs.contains_key(owner) {
                        self.owner_of.insert(session.to_string(), owner.to_string());
                        return self.call_owner(owner, request);
                    }
                }
                continue;
            }
            return Outcome::Refused(last);
        }
        Outcome::Refused(last)
    }

    fn call_owner(&mut self, owner: &str, request: &Value) -> Outcome {
        let Some(client) = self.client(owner) else {
            return Outcome::Refused(format!("cannot reach {owner}"));
        };
        match client.call(request) {
            None => {
                self.clients.remove(owner);
                Outcome::Unknown
            }
            Some(reply) if reply["ok"] == json!(true) => Outcome::Ok(reply),
            Some(reply) => Outcome::Refused(reply["error"].as_str().unwrap_or("?").to_string()),
        }
    }

    /// Calls until the answer is `ok`, bounded by [`SETUP_DEADLINE`].
    pub fn call_until_ok(&mut self, session: &str, request: &Value) -> Value {
        let started = Instant::now();
        loop {
            match self.call(session, request) {
                Outcome::Ok(reply) => return reply,
                Outcome::Refused(error) => {
                    assert!(
                        started.elapsed() < SETUP_DEADLINE,
                        "{session}: {request} refused: {error}"
                    );
                }
                Outcome::Unknown => {
                    assert!(
                        started.elapsed() < SETUP_DEADLINE,
                        "{session}: {request}: no answer"
                    );
                }
            }
            std::thread::sleep(POLL);
        }
    }
}

/// What the test sent to one session and what the fleet acknowledged.
#[derive(Default)]
pub struct SessionModel {
    pub acked: BTreeMap<u64, String>,
    pub sent: BTreeSet<String>,
    pub counter: u64,
}

pub fn create_sessions(router: &mut Router, sessions: &[String]) {
    for session in sessions {
        let header = format!(r#"{{"version":0,"id":"{session}","createdAt":1}}"#);
        let request = json!({"op": "create", "session": session, "header": header});
        let started = Instant::now();
        loop {
            match router.call(session, &request) {
                Outcome::Ok(_) => break,
                Outcome::Refused(error) if error.contains("exists") => break,
                _ => {}
            }
            assert!(
                started.elapsed() < SETUP_DEADLINE,
                "cannot create {session}"
            );
            std::thread::sleep(POLL);
        }
    }
}

/// The request appending two events with unique data to `session`; records them as sent.
pub fn append_request(session: &str, model: &mut SessionModel) -> (Value, Vec<String>) {
    let data: Vec<String> = (0..2)
        .map(|offset| format!(r#"{{"text":"{session} {} {offset}"}}"#, model.counter))
        .collect();
    model.counter += 1;
    model.sent.extend(data.iter().cloned());
    let events: Vec<Value> = data
        .iter()
        .map(|data| json!({"type": "message", "data": data}))
        .collect();
    (
        json!({"op": "append", "session": session, "events": events}),
        data,
    )
}

/// Records an acknowledged append of `data` at the reply's `first_seq`.
pub fn record_ack(session: &str, model: &mut SessionModel, reply: &Value, data: Vec<String>) {
    let first = reply["first_seq"].as_u64().unwrap();
    for (offset, data) in data.into_iter().enumerate() {
        let previous = model.acked.insert(first + offset as u64, data);
        assert!(
            previous.is_none(),
            "{session}: seq {first} acknowledged twice"
        );
    }
}

/// Appends one batch of two events to `session`; records what was sent and acknowledged.
pub fn append_once(router: &mut Router, session: &str, model: &mut SessionModel) -> bool {
    let (request, data) = append_request(session, model);
    match router.call(session, &request) {
        Outcome::Ok(reply) => {
            record_ack(session, model, &reply, data);
            true
        }
        Outcome::Unknown | Outcome::Refused(_) => false,
    }
}

/// Checks the session as its owner serves it: seqs contiguous from 0, every acknowledged
/// event at its seq, nothing stored twice or never sent. Returns the events stored.
pub fn check_session(router: &mut Router, session: &str, model: &SessionModel) -> usize {
    let reply = router.call_until_ok(session, &json!({"op": "read", "session": session}));
    let events = reply["events"].as_array().unwrap();
    let mut seen = BTreeSet::new();
    for (index, event) in events.iter().enumerate() {
        assert_eq!(
            event["seq"].as_u64(),
            Some(index as u64),
            "{session}: seq gap"
        );
        let data = event["data"].as_str().unwrap().to_string();
        assert!(
            model.sent.contains(&data),
            "{session}: {data} was never sent"
        );
        assert!(seen.insert(data.clone()), "{session}: {data} stored twice");
    }
    for (seq, data) in &model.acked {
        let stored = events.get(usize::try_from(*seq).unwrap());
        assert_eq!(
            stored.and_then(|event| event["data"].as_str()),
            Some(data.as_str()),
            "{session}: acknowledged seq {seq} lost or changed"
        );
    }
    events.len()
}

/// Runs `tests/fleet/servers.sh ARGS` on the run directory the servers were started with.
pub fn servers_script(arguments: &[&str]) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fleet/servers.sh");
    let mut command = Command::new("bash");
    command.arg(script).args(arguments);
    if let Ok(run_dir) = std::env::var("DSHDB_FLEET_RUN_DIR") {
        command.env("FLEET_RUN_DIR", run_dir);
    }
    let status = command.status().unwrap();
    assert!(status.success(), "servers.sh {arguments:?} failed");
}

/// The servers' run directory (their stores, logs and pid files).
pub fn run_dir() -> PathBuf {
    PathBuf::from(std::env::var("DSHDB_FLEET_RUN_DIR").expect("DSHDB_FLEET_RUN_DIR is not set"))
}

/// Sessions named `<prefix>x<token>x<index>`.
pub fn session_names(prefix: &str, token: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|index| format!("{prefix}x{token}x{index}"))
        .collect()
}

/// Index of the node a router last saw owning `session`.
pub fn owner_index(fleet: &Fleet, router: &Router, session: &str) -> Option<usize> {
    let owner = router.owner_of.get(session)?;
    fleet.ids.iter().position(|id| id == owner)
}

/// Each session's owner (its node's index) as the router last saw it, and the node that
/// owns the most of them.
pub fn owners_and_busiest(
    fleet: &Fleet,
    router: &Router,
    sessions: &[String],
) -> (Vec<usize>, usize) {
    let owners: Vec<usize> = sessions
        .iter()
        .map(|session| owner_index(fleet, router, session).expect("the router knows the owner"))
        .collect();
    let busiest = (0..fleet.ids.len())
        .max_by_key(|index| owners.iter().filter(|owner| **owner == *index).count())
        .expect("a fleet has nodes");
    (owners, busiest)
}

/// A node's replication lag in events (its status), acknowledged events only it holds.
pub fn lag_events(fleet: &Fleet, index: usize) -> u64 {
    fleet.status(index)["replication"]["lag"]["events"]
        .as_u64()
        .unwrap()
}

/// Bound of one monitoring request.
const CURL_TIMEOUT_SECONDS: &str = "2";

/// A NATS monitoring endpoint's JSON (`/varz`, `/jsz?streams=true`) on `port`.
pub fn monitor_json(port: u16, path: &str) -> Option<Value> {
    let output = Command::new("curl")
        .args(["-sf", "--max-time", CURL_TIMEOUT_SECONDS])
        .arg(format!("http://127.0.0.1:{port}/{path}"))
        .output()
        .ok()?;
    serde_json::from_slice(&output.stdout).ok()
}

/// The three NATS servers of `tests/fleet/servers.sh` (node numbers) and their monitoring
/// ports.
pub const NATS_SERVERS: [u16; 3] = [1, 2, 3];

pub fn nats_monitor_port(server: u16) -> u16 {
    18220 + server
}

/// Whether NATS server `server` answers `/healthz` with `ok` (JetStream current).
pub fn nats_healthy(server: u16) -> bool {
    monitor_json(nats_monitor_port(server), "healthz")
        .is_some_and(|health| health["status"] == "ok")
}

/// Longest wait for the NATS servers to be healthy again after a fault test.
pub const NATS_HEALTHY_DEADLINE: Duration = Duration::from_secs(30);

/// Whether the JetStream cluster has settled: the three servers name the same meta leader,
/// each sees a leader for every stream (tail streams and KV buckets alike), and they report
/// the same `messages` and `last_seq` for every tail stream (`DSH_*`; the KV streams change
/// with every lease refresh). `/healthz` says ok before that: after a server's restart,
/// F2 saw the meta leader and some streams stay leaderless for 10 s and more with every
/// `/healthz` ok, and a test started then measured the previous test's elections.
pub fn cluster_settled() -> bool {
    let mut metas = BTreeSet::new();
    let mut tails = Vec::new();
    for server in NATS_SERVERS {
        let Some(jsz) = monitor_json(nats_monitor_port(server), "jsz?streams=true") else {
            return false;
        };
        let meta = jsz["meta_cluster"]["leader"].as_str().unwrap_or("");
        if meta.is_empty() {
            return false;
        }
        metas.insert(meta.to_string());
        let mut tail = BTreeMap::new();
        let Some(accounts) = jsz["account_details"].as_array() else {
            // No stream exists yet (a fresh cluster): the meta leader is all there is.
            tails.push(tail);
            continue;
        };
        for account in accounts {
            for stream in account["stream_detail"].as_array().into_iter().flatten() {
                let name = stream["name"].as_str().unwrap_or("");
                if stream["cluster"]["leader"]
                    .as_str()
                    .unwrap_or("")
                    .is_empty()
                {
                    return false;
                }
                if name.starts_with("DSH_") {
                    tail.insert(
                        name.to_string(),
                        (
                            stream["state"]["messages"].as_u64(),
                            stream["state"]["last_seq"].as_u64(),
                        ),
                    );
                }
            }
        }
        tails.push(tail);
    }
    metas.len() == 1 && tails.iter().all(|tail| *tail == tails[0])
}

/// Longest wait for [`cluster_settled`] before a fault test starts.
pub const CLUSTER_SETTLE_DEADLINE: Duration = Duration::from_secs(60);

/// Waits until [`cluster_settled`] (fails the test after [`CLUSTER_SETTLE_DEADLINE`]).
pub fn wait_cluster_settled() -> Duration {
    wait_until(
        "the NATS cluster settles (one meta leader, every stream led, tail replicas equal)",
        CLUSTER_SETTLE_DEADLINE,
        cluster_settled,
    )
}

/// Starts servers again with `servers.sh <restart>` if a test ends while they are down,
/// then waits until the three NATS servers are healthy, so that the tests after it find
/// them (cargo runs the test binaries one after another against the same servers).
pub struct ServersBack {
    pub restart: Vec<String>,
    pub down: bool,
}

impl ServersBack {
    pub fn new(restart: &[&str]) -> ServersBack {
        ServersBack {
            restart: restart.iter().map(|word| word.to_string()).collect(),
            down: false,
        }
    }

    /// Runs the restart now.
    pub fn start(&mut self) {
        let words: Vec<&str> = self.restart.iter().map(String::as_str).collect();
        servers_script(&words);
        self.down = false;
    }
}

impl Drop for ServersBack {
    fn drop(&mut self) {
        if self.down {
            self.start();
        }
        let started = Instant::now();
        while !NATS_SERVERS.iter().all(|server| nats_healthy(*server)) {
            if started.elapsed() > NATS_HEALTHY_DEADLINE {
                eprintln!("NATS servers not healthy after {NATS_HEALTHY_DEADLINE:?}");
                return;
            }
            std::thread::sleep(POLL);
        }
    }
}

/// What one session's writer thread saw.
pub struct Writer {
    pub model: SessionModel,
    /// When each acknowledgement came back.
    pub acked_at: Vec<Instant>,
    /// The refusals seen, by text (for failure messages).
    pub refusals: BTreeMap<String, usize>,
    /// Appends whose outcome stayed unknown (connection lost or no reply in time).
    pub unknown: usize,
}

/// Appends batches to `session` through `router` until `stop` is set, pausing `pause`
/// between appends; continues `model`.
pub fn write_until(
    router: Router,
    session: String,
    model: SessionModel,
    pause: Duration,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Writer {
    let noted = std::sync::Mutex::new(Vec::new());
    write_until_noting(router, session, model, pause, stop, &noted)
}

/// As [`write_until`], also noting each acknowledgement's time in `noted` as it comes (for
/// a caller that decides when to stop from them).
pub fn write_until_noting(
    mut router: Router,
    session: String,
    model: SessionModel,
    pause: Duration,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    noted: &std::sync::Mutex<Vec<Instant>>,
) -> Writer {
    let mut writer = Writer {
        model,
        acked_at: Vec::new(),
        refusals: BTreeMap::new(),
        unknown: 0,
    };
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let (request, data) = append_request(&session, &mut writer.model);
        match router.call(&session, &request) {
            Outcome::Ok(reply) => {
                record_ack(&session, &mut writer.model, &reply, data);
                let now = Instant::now();
                writer.acked_at.push(now);
                noted
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(now);
            }
            Outcome::Refused(error) => *writer.refusals.entry(error).or_default() += 1,
            Outcome::Unknown => writer.unknown += 1,
        }
        std::thread::sleep(pause);
    }
    writer
}

/// The NATS server (1..=3) leading `stream` (a tail stream or a KV bucket's `KV_*`), as the
/// first server that answers `/jsz` sees it.
pub fn stream_leader(stream: &str) -> Option<u16> {
    NATS_SERVERS.iter().find_map(|server| {
        let jsz = monitor_json(nats_monitor_port(*server), "jsz?streams=true")?;
        let leader = jsz["account_details"]
            .as_array()?
            .iter()
            .flat_map(|account| account["stream_detail"].as_array().into_iter().flatten())
            .find(|detail| detail["name"] == stream)?["cluster"]["leader"]
            .as_str()?
            .strip_prefix('n')?
            .parse()
            .ok()?;
        Some(leader)
    })
}

/// The NATS server (1..=3) leading JetStream's meta group, as the first server that
/// answers `/jsz` sees it.
pub fn meta_leader() -> Option<u16> {
    NATS_SERVERS.iter().find_map(|server| {
        let jsz = monitor_json(nats_monitor_port(*server), "jsz")?;
        jsz["meta_cluster"]["leader"]
            .as_str()?
            .strip_prefix('n')?
            .parse()
            .ok()
    })
}

/// Longest wait for a stream's leadership to move to the server asked for.
pub const LEADER_MOVE_DEADLINE: Duration = Duration::from_secs(30);
/// Pause between two leadership stepdown requests.
pub const STEPDOWN_RETRY: Duration = Duration::from_secs(2);

/// Moves `stream`'s leadership to server `to` (`STREAM.LEADER.STEPDOWN` with a preferred
/// placement, asked again until it holds); panics after [`LEADER_MOVE_DEADLINE`].
pub async fn move_stream_leader(nats: &dshdb_fleet::nats::Nats, stream: &str, to: u16) {
    let started = Instant::now();
    while stream_leader(stream) != Some(to) {
        assert!(
            started.elapsed() < LEADER_MOVE_DEADLINE,
            "{stream}: leadership did not move to n{to}"
        );
        let request = format!(r#"{{"placement":{{"preferred":"n{to}"}}}}"#);
        let _ = nats
            .context()
            .client()
            .request(
                format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
                request.into(),
            )
            .await;
        tokio::time::sleep(STEPDOWN_RETRY).await;
    }
}
