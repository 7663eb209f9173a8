//! F1 of FLEET.md, scaled to fit CI: three `dshdb-fleet-node` processes on the real servers
//! (`tests/fleet/servers.sh`), a load generator appending to 30 sessions in `replicated`
//! mode, `kill -9` of node n2 mid-ingest, ingest continuing on the survivors. Checks: every
//! event acknowledged to the generator is present exactly once at its acknowledged seq on the
//! new owners, seqs contiguous, nothing present that was never sent; n2's sessions accept
//! appends again within the lease TTL + 5 s.
//!
//! Skipped (a SKIPPED line) without `DSHDB_FLEET_SERVERS=1`, failed under `CI=true`.

#![allow(clippy::unwrap_used)]

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NODES: usize = 3;
const SESSIONS: usize = 30;
const SHARDS: u32 = 16;
const NODE_TTL: Duration = Duration::from_secs(2);
const TICK: Duration = Duration::from_millis(300);
/// Ingest before the kill, and after it.
const BEFORE_KILL: Duration = Duration::from_secs(3);
const AFTER_KILL: Duration = Duration::from_secs(9);
/// FLEET.md: a dead node's sessions accept appends again within the lease TTL + 5 s.
const RECOVERY_BOUND: Duration = Duration::from_secs(7);
/// Longest wait for a node to listen, or for a session to find an owner.
const SETUP_DEADLINE: Duration = Duration::from_secs(30);
/// Longest wait for one reply from a node.
const REPLY_TIMEOUT: Duration = Duration::from_secs(15);

/// Kills every node process when the test ends, however it ends.
struct Fleet {
    children: Vec<Option<Child>>,
    ids: Vec<String>,
    addrs: Vec<String>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn spawn_fleet(token: &str) -> Fleet {
    let mut fleet = Fleet {
        children: Vec::new(),
        ids: Vec::new(),
        addrs: Vec::new(),
    };
    for index in 1..=NODES {
        let id = format!("n{index}x{token}");
        let addr = format!("127.0.0.1:{}", free_port());
        let store = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("f1-{id}"));
        let _ = std::fs::remove_dir_all(&store);
        let child = Command::new(env!("CARGO_BIN_EXE_dshdb-fleet-node"))
            .args(["--id", &id, "--listen", &addr])
            .arg("--store")
            .arg(&store)
            .args(["--ttl-ms", &NODE_TTL.as_millis().to_string()])
            .args(["--tick-ms", &TICK.as_millis().to_string()])
            .args(["--shards", &SHARDS.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        fleet.children.push(Some(child));
        fleet.ids.push(id);
        fleet.addrs.push(addr);
    }
    fleet
}

/// One request-reply connection to a node.
struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    fn connect(addr: &str) -> std::io::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
        Ok(Client {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// The reply, or `None` when the connection failed (the outcome is unknown).
    fn call(&mut self, request: &Value) -> Option<Value> {
        let mut line = request.to_string();
        line.push('\n');
        self.writer.write_all(line.as_bytes()).ok()?;
        let mut reply = String::new();
        match self.reader.read_line(&mut reply) {
            Ok(0) | Err(_) => None,
            Ok(_) => serde_json::from_str(&reply).ok(),
        }
    }
}

/// Routes requests to sessions' owners, following `moved` answers.
struct Router {
    addrs: HashMap<String, String>,
    order: Vec<String>,
    clients: HashMap<String, Client>,
    owner_of: HashMap<String, String>,
}

enum Outcome {
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

    fn call(&mut self, session: &str, request: &Value) -> Outcome {
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
                    if owner != id {
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
}

#[derive(Default)]
struct SessionModel {
    acked: BTreeMap<u64, String>,
    sent: BTreeSet<String>,
    counter: u64,
}

fn wait_listening(addr: &str) {
    let started = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(started.elapsed() < SETUP_DEADLINE, "{addr} never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn create_sessions(router: &mut Router, sessions: &[String]) {
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
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Appends one batch of two events to `session`; records what was sent and acknowledged.
fn append_once(router: &mut Router, session: &str, model: &mut SessionModel) -> bool {
    let data: Vec<String> = (0..2)
        .map(|offset| format!(r#"{{"text":"{session} {} {offset}"}}"#, model.counter))
        .collect();
    model.counter += 1;
    model.sent.extend(data.iter().cloned());
    let events: Vec<Value> = data
        .iter()
        .map(|data| json!({"type": "message", "data": data}))
        .collect();
    let request = json!({"op": "append", "session": session, "events": events});
    match router.call(session, &request) {
        Outcome::Ok(reply) => {
            let first = reply["first_seq"].as_u64().unwrap();
            for (offset, data) in data.into_iter().enumerate() {
                let previous = model.acked.insert(first + offset as u64, data);
                assert!(
                    previous.is_none(),
                    "{session}: seq {first} acknowledged twice"
                );
            }
            true
        }
        Outcome::Unknown | Outcome::Refused(_) => false,
    }
}

fn check_session(router: &mut Router, session: &str, model: &SessionModel) -> usize {
    let request = json!({"op": "read", "session": session});
    let started = Instant::now();
    let reply = loop {
        if let Outcome::Ok(reply) = router.call(session, &request) {
            break reply;
        }
        assert!(started.elapsed() < SETUP_DEADLINE, "cannot read {session}");
        std::thread::sleep(Duration::from_millis(200));
    };
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

#[test]
fn f1_node_kill_mid_ingest() {
    if std::env::var("DSHDB_FLEET_SERVERS").as_deref() != Ok("1") {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but DSHDB_FLEET_SERVERS is not set: start tests/fleet/servers.sh"
        );
        eprintln!("SKIPPED f1_node_kill_mid_ingest: DSHDB_FLEET_SERVERS is not set");
        return;
    }
    let token = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    // The streams and buckets exist before the nodes start, so that they start together.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let nats_config = dshdb_fleet::nats::NatsConfig {
        urls: std::env::var("DSHDB_FLEET_NATS").unwrap(),
        replicas: 3,
        node_ttl: NODE_TTL,
    };
    runtime
        .block_on(dshdb_fleet::nats::Nats::connect(&nats_config))
        .unwrap();
    let mut fleet = spawn_fleet(&token);
    for addr in &fleet.addrs {
        wait_listening(addr);
    }
    let mut router = Router {
        addrs: fleet
            .ids
            .iter()
            .cloned()
            .zip(fleet.addrs.iter().cloned())
            .collect(),
        order: fleet.ids.clone(),
        clients: HashMap::new(),
        owner_of: HashMap::new(),
    };
    let sessions: Vec<String> = (0..SESSIONS)
        .map(|index| format!("f1x{token}x{index}"))
        .collect();
    create_sessions(&mut router, &sessions);
    let mut models: Vec<SessionModel> = sessions.iter().map(|_| SessionModel::default()).collect();

    // The kill comes from another thread while appends are in flight: some outcomes are
    // unknown to the generator (never acknowledged), as with a real crash.
    let victim = fleet.ids[1].clone();
    let mut child = fleet.children[1].take().unwrap();
    let killed_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let killer = {
        let killed_at = killed_at.clone();
        std::thread::spawn(move || {
            std::thread::sleep(BEFORE_KILL);
            child.kill().unwrap(); // SIGKILL
            *killed_at.lock().unwrap() = Some(Instant::now());
            child.wait().unwrap();
        })
    };
    let started = Instant::now();
    let mut victims: Option<Vec<usize>> = None;
    let mut recovered: HashMap<usize, Duration> = HashMap::new();
    let mut acked_after = 0u64;
    while started.elapsed() < BEFORE_KILL + AFTER_KILL {
        let kill_time = *killed_at.lock().unwrap();
        if let (Some(_), None) = (kill_time, &victims) {
            victims = Some(
                (0..SESSIONS)
                    .filter(|index| router.owner_of.get(&sessions[*index]) == Some(&victim))
                    .collect(),
            );
        }
        for index in 0..SESSIONS {
            if append_once(&mut router, &sessions[index], &mut models[index]) {
                if let Some(kill_time) = kill_time {
                    acked_after += 1;
                    recovered
                        .entry(index)
                        .or_insert_with(|| kill_time.elapsed());
                }
            }
        }
    }
    killer.join().unwrap();
    let victims = victims.expect("the kill happened during ingest");
    let mut spread: BTreeMap<String, usize> = BTreeMap::new();
    for owner in router.owner_of.values() {
        *spread.entry(owner.clone()).or_default() += 1;
    }
    eprintln!("f1: owners at the end: {spread:?}");
    assert!(!victims.is_empty(), "n2 owned none of the sessions");
    let acked: usize = models.iter().map(|model| model.acked.len()).sum();
    let mut stored = 0;
    for (session, model) in sessions.iter().zip(&models) {
        stored += check_session(&mut router, session, model);
    }
    let worst = victims
        .iter()
        .map(|index| recovered.get(index).copied().unwrap_or(AFTER_KILL))
        .max()
        .unwrap();
    eprintln!(
        "f1: {SESSIONS} sessions, {} on n2; events acked {acked} (batches acked after the \
         kill {acked_after}), stored {stored} (the rest: outcomes unknown to the generator, \
         durable anyway); n2's sessions writable again after at most {worst:?}",
        victims.len()
    );
    assert!(
        worst <= RECOVERY_BOUND,
        "n2's sessions unavailable for {worst:?}"
    );
    drop(fleet);
}
