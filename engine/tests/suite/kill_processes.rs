//! Real processes on one store (format-spec/08-many-processes.md): writer processes each
//! append `Sync` to their own session and print every acknowledged seq; follower processes
//! subscribe to every session and print every event they are given. The parent `kill -9`s
//! random writers again and again and restarts them (the new one takes the dead one's lease
//! and continues at its next seq), then stops everyone and checks:
//! - every acknowledged event is in the store once, in order, byte-identical, no gaps;
//! - every follower saw every event of every session exactly once, in seq order.
//!
//! CI size: 8 writers, 2 followers, 100 kills within a time budget. `DSHDB_SOAK=1` runs
//! 400 kills with a longer budget.

use dshdb::store::{NewEvent, Options, Store};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const ROLE_ENV: &str = "DSHDB_MULTI_ROLE";
const DIR_ENV: &str = "DSHDB_MULTI_DIR";
const SESSION_ENV: &str = "DSHDB_MULTI_SESSION";
const WRITERS: usize = 8;
/// `SIGKILL`: how the parent ends a writer.
const KILL_SIGNAL: i32 = 9;
const FOLLOWERS: usize = 2;
/// Writers stop appending once this file exists.
const STOP_FILE: &str = "stop-writing";
/// Followers exit once this file exists and nothing new came for [`FOLLOWER_QUIET`].
const DONE_FILE: &str = "writers-done";
const FOLLOWER_QUIET: Duration = Duration::from_secs(1);
/// Pause between a writer's appends, so that eight of them leave the two cores to the rest.
const APPEND_PAUSE: Duration = Duration::from_millis(2);
/// Writers that also run maintenance passes (F-08-16), and how many appends apart: sealing
/// and run rewriting then happen while the others append, follow and get killed.
const MAINTAINING_WRITERS: usize = 3;
const MAINTAIN_EVERY_APPENDS: u64 = 40;

fn options() -> Options {
    Options {
        shared: true,
        shared_maintenance: true,
        segment_bytes: 128 * 1024,
        ..Options::default()
    }
}

fn session_id(writer: usize) -> String {
    format!("w{writer}")
}

fn data_for(id: &str, seq: u64) -> String {
    format!(
        r#"{{"id":"{id}","seq":{seq},"text":"{}"}}"#,
        "m".repeat((seq % 23) as usize * 9)
    )
}

fn store_path(dir: &Path) -> PathBuf {
    dir.join("store")
}

/// The writer process: appends to its session until the stop file exists.
#[test]
fn multi_writer_process() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("writer") {
        return;
    }
    let dir = PathBuf::from(std::env::var(DIR_ENV).expect("dir"));
    let id = std::env::var(SESSION_ENV).expect("session");
    let store = Store::open(store_path(&dir), options()).expect("writer open");
    let mut writer = loop {
        match store.writer(&id) {
            Ok(writer) => break writer,
            Err(dshdb::Error::UnknownSession { .. }) => {
                if let Ok(writer) = store.create_session_with_id(&id) {
                    break writer;
                }
            }
            Err(dshdb::Error::SessionBusy { .. }) => {}
            Err(error) => panic!("writer {id}: {error}"),
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let maintains = (0..MAINTAINING_WRITERS).any(|writer| id == session_id(writer));
    let mut appended = 0u64;
    let mut out = std::io::stdout().lock();
    while !dir.join(STOP_FILE).exists() {
        let seq = store.session(&id).expect("session").events;
        let data = data_for(&id, seq);
        let receipt = writer
            .append(NewEvent::new("assistant/chunk", &data))
            .expect("append");
        assert_eq!(receipt.first_seq, seq);
        writeln!(out, "ack {seq}").expect("report ack");
        out.flush().expect("flush ack");
        appended += 1;
        if maintains && appended.is_multiple_of(MAINTAIN_EVERY_APPENDS) {
            let report = store.maintain().expect("maintain beside the others");
            writeln!(out, "sealed {}", report.segments_sealed).expect("report seal");
        }
        std::thread::sleep(APPEND_PAUSE);
    }
    drop(writer);
    store.close().expect("writer close");
}

/// The follower process: one subscription per writer's session, each event printed as
/// `id seq same` (`same`: its data is what the writer wrote).
#[test]
fn multi_follower_process() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("follower") {
        return;
    }
    let dir = PathBuf::from(std::env::var(DIR_ENV).expect("dir"));
    let store = Store::open(store_path(&dir), options()).expect("follower open");
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let threads: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let store = store.clone();
            let out = out.clone();
            let dir = dir.clone();
            std::thread::spawn(move || follow(&store, &session_id(writer), &dir, &out))
        })
        .collect();
    for thread in threads {
        thread.join().expect("follower thread");
    }
    store.close().expect("follower close");
}

fn follow(store: &Store, id: &str, dir: &Path, out: &Mutex<std::io::Stdout>) {
    let mut subscription = store.subscribe(id, 0).expect("subscribe");
    let mut quiet_since = Instant::now();
    loop {
        match subscription
            .next_timeout(Duration::from_millis(100))
            .expect("follow")
        {
            Some(event) => {
                let same = event.data == data_for(id, event.seq);
                let mut out = out.lock().expect("stdout");
                writeln!(out, "seen {id} {} {same}", event.seq).expect("report");
                out.flush().expect("flush");
                quiet_since = Instant::now();
            }
            None if dir.join(DONE_FILE).exists() && quiet_since.elapsed() > FOLLOWER_QUIET => {
                return
            }
            None => {}
        }
    }
}

/// A child process and the thread collecting its output lines.
struct Worker {
    child: Child,
    lines: JoinHandle<Vec<String>>,
}

fn spawn(role: &str, dir: &Path, session: Option<&str>) -> Worker {
    let test = match role {
        "writer" => "kill_processes::multi_writer_process",
        _ => "kill_processes::multi_follower_process",
    };
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .env(DIR_ENV, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(session) = session {
        command.env(SESSION_ENV, session);
    }
    let mut child = command.spawn().expect("spawn worker");
    let stdout = child.stdout.take().expect("worker stdout");
    let lines = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect()
    });
    Worker { child, lines }
}

/// What follows `tag` in a worker's output line. The test harness prints `test NAME ... `
/// without a line end before the test's own output, so the first report shares its line.
fn report<'line>(line: &'line str, tag: &str) -> Option<&'line str> {
    line.find(tag).map(|start| &line[start + tag.len()..])
}

/// Segments a writer's maintenance passes sealed, from its output.
fn sealed(lines: &[String]) -> u64 {
    lines
        .iter()
        .filter_map(|line| report(line, "sealed ")?.trim().parse::<u64>().ok())
        .sum()
}

/// Acknowledged seqs from a writer's output (the test harness's lines skipped).
fn acks(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .filter_map(|line| report(line, "ack ")?.trim().parse::<u64>().ok())
        .collect()
}

fn wait_bounded(worker: &mut Worker, limit: Duration, what: &str) {
    let started = Instant::now();
    loop {
        if let Some(status) = worker.child.try_wait().expect("wait") {
            assert!(status.success(), "{what} exited with {status}");
            return;
        }
        if started.elapsed() > limit {
            let _ = worker.child.kill();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn writers_killed_again_and_again_lose_nothing_and_followers_see_everything_once() {
    if std::env::var(ROLE_ENV).is_ok() {
        return;
    }
    let soak = std::env::var("DSHDB_SOAK").is_ok_and(|value| value == "1");
    let (kill_target, budget) = if soak {
        (400, Duration::from_secs(600))
    } else {
        (100, Duration::from_secs(60))
    };
    let scratch = crate::common::temp_dir("kill-processes");
    let dir = scratch.path().to_path_buf();
    // The first opener creates the store; everyone else joins it.
    Store::open(store_path(&dir), options())
        .expect("create")
        .close()
        .expect("close");
    let mut followers: Vec<Worker> = (0..FOLLOWERS)
        .map(|_| spawn("follower", &dir, None))
        .collect();
    let mut writers: Vec<Worker> = (0..WRITERS)
        .map(|writer| spawn("writer", &dir, Some(&session_id(writer))))
        .collect();
    let mut acked: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    let mut random = crate::common::Rng(0x0dd_ba11);
    let started = Instant::now();
    let mut kills = 0;
    let mut segments_sealed = 0;
    while kills < kill_target && started.elapsed() < budget {
        std::thread::sleep(Duration::from_millis(50 + random.below(250)));
        let victim = random.below(WRITERS as u64) as usize;
        let worker = &mut writers[victim];
        worker.child.kill().expect("kill -9");
        let status = worker.child.wait().expect("wait for the killed writer");
        // A writer runs until it is killed or the stop file exists: one that exited on its
        // own failed (could not open, append or maintain), and that is this test's failure.
        assert!(
            status.signal() == Some(KILL_SIGNAL),
            "writer {victim} exited on its own before it was killed ({status}); its stderr \
             above says why"
        );
        let dead = std::mem::replace(worker, spawn("writer", &dir, Some(&session_id(victim))));
        let lines = dead.lines.join().expect("lines");
        segments_sealed += sealed(&lines);
        acked.entry(victim).or_default().extend(acks(&lines));
        kills += 1;
    }
    let killing = started.elapsed();
    std::fs::write(dir.join(STOP_FILE), b"").expect("stop file");
    for (writer, worker) in writers.iter_mut().enumerate() {
        wait_bounded(worker, Duration::from_secs(60), &format!("writer {writer}"));
    }
    for (writer, worker) in writers.into_iter().enumerate() {
        let lines = worker.lines.join().expect("lines");
        segments_sealed += sealed(&lines);
        acked.entry(writer).or_default().extend(acks(&lines));
    }
    std::fs::write(dir.join(DONE_FILE), b"").expect("done file");
    for (index, worker) in followers.iter_mut().enumerate() {
        wait_bounded(
            worker,
            Duration::from_secs(60),
            &format!("follower {index}"),
        );
    }
    let seen: Vec<Vec<String>> = followers
        .into_iter()
        .map(|worker| worker.lines.join().expect("lines"))
        .collect();
    let store = Store::open(
        store_path(&dir),
        Options {
            shared: false,
            ..options()
        },
    )
    .expect("exclusive reopen after everyone left");
    let mut lengths = BTreeMap::new();
    for writer in 0..WRITERS {
        let id = session_id(writer);
        let events = store.read(&id, 0, u64::MAX).expect("read");
        for (seq, event) in events.iter().enumerate() {
            assert_eq!(event.seq, seq as u64, "{id}: seq order");
            assert_eq!(event.data, data_for(&id, seq as u64), "{id} seq {seq}");
        }
        let length = events.len() as u64;
        for seq in acked.get(&writer).into_iter().flatten() {
            assert!(
                *seq < length,
                "{id}: acknowledged seq {seq} lost (length {length})"
            );
        }
        lengths.insert(id, length);
    }
    for (follower, lines) in seen.iter().enumerate() {
        let mut per_session: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for line in lines.iter().filter_map(|line| report(line, "seen ")) {
            let mut fields = line.split_whitespace();
            let (Some(id), Some(seq), Some(same)) = (fields.next(), fields.next(), fields.next())
            else {
                panic!("follower {follower}: odd line {line:?}");
            };
            assert_eq!(same, "true", "follower {follower}: {id} {seq} differs");
            per_session
                .entry(id.to_string())
                .or_default()
                .push(seq.parse().expect("seq"));
        }
        for (id, length) in &lengths {
            let got = per_session.remove(id).unwrap_or_default();
            let want: Vec<u64> = (0..*length).collect();
            let missing: Vec<u64> = want
                .iter()
                .filter(|seq| !got.contains(seq))
                .copied()
                .collect();
            assert!(
                got == want,
                "follower {follower}: {id} saw {} events (want {length}), not each once in \
                 order; missing {missing:?}, last acknowledged {:?}",
                got.len(),
                acked
                    .get(&id[1..].parse::<usize>().expect("writer"))
                    .and_then(|seqs| seqs.iter().max())
            );
        }
    }
    let total: u64 = lengths.values().sum();
    let acknowledged: usize = acked.values().map(Vec::len).sum();
    eprintln!(
        "many-process kill test: {kills} kills of {WRITERS} writers in {killing:?}, \
         {acknowledged} acknowledged, {total} events, {FOLLOWERS} followers saw all, \
         {segments_sealed} segments sealed beside them"
    );
    assert!(
        segments_sealed > 0,
        "no maintenance pass sealed a segment while the others ran"
    );
    assert!(kills >= 20, "only {kills} kills within {budget:?}");
}
