//! Real kills: a child process appends with `Sync` and prints every acknowledged seq; the
//! parent SIGKILLs it at a random moment, reopens the store and checks that every
//! acknowledged event is there, byte-identical, and that nothing unwritten appeared.

use dshdb::store::{NewEvent, Options, Store};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Kill iterations per run.
const KILLS: u64 = 200;
const CHILD_ENV: &str = "DSHDB_KILL_CHILD_DIR";

fn data_for(seq: u64) -> String {
    format!(
        r#"{{"seq":{seq},"text":"{}"}}"#,
        "k".repeat((seq % 50) as usize * 20)
    )
}

fn options() -> Options {
    Options {
        segment_bytes: 256 * 1024,
        ..Options::default()
    }
}

/// The child: appends until killed. Run only when the parent sets the environment variable.
#[test]
fn kill_child_appender() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let store = Store::open(&dir, options()).expect("child open");
    let mut writer = match store.writer("victim") {
        Ok(writer) => writer,
        Err(_) => store
            .create_session_with_id("victim")
            .expect("child create"),
    };
    let mut out = std::io::stdout().lock();
    loop {
        let seq = store.session("victim").expect("session").events;
        let data = data_for(seq);
        let receipt = writer
            .append(NewEvent::new("assistant/chunk", &data))
            .expect("child append");
        assert_eq!(receipt.first_seq, seq);
        writeln!(out, "{}", receipt.first_seq).expect("report ack");
        out.flush().expect("flush ack");
    }
}

#[test]
fn sigkilled_appender_loses_no_acknowledged_event() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("dshdb-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let executable = std::env::current_exe().expect("test binary");
    let mut random = 0x1234_5678_u64;
    let mut total_acked = 0;
    for iteration in 0..KILLS {
        let mut child = Command::new(&executable)
            .args([
                "--exact",
                "kill::kill_child_appender",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        let wanted_acks = random % 40;
        let stdout = child.stdout.take().expect("child stdout");
        let mut acked: Option<u64> = None;
        let started = Instant::now();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(seq) = line.trim().parse::<u64>() {
                acked = Some(seq);
                if seq % 40 >= wanted_acks || started.elapsed() > Duration::from_secs(2) {
                    break;
                }
            }
        }
        child.kill().expect("kill");
        let _ = child.wait();
        let store = Store::open(&dir, options()).expect("reopen after kill");
        let length = store
            .session("victim")
            .map(|summary| summary.events)
            .unwrap_or(0);
        if let Some(seq) = acked {
            assert!(
                length > seq,
                "iteration {iteration}: acked seq {seq} lost (length {length})"
            );
            total_acked += 1;
        }
        for event in store.read("victim", 0, u64::MAX).expect("read") {
            assert_eq!(event.data, data_for(event.seq), "iteration {iteration}");
        }
        store.close().expect("close");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = writeln!(std::io::stderr(), "kills: {KILLS}");
    assert!(
        total_acked > KILLS / 2,
        "too few iterations saw an ack: {total_acked}"
    );
}
