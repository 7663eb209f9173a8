//! `dshdb quickstart DIR`: writes a few realistic DSH agent sessions, closes the store,
//! reopens it and prints what it finds.

use anyhow::{Context, Result};
use dshdb::store::now_millis;
use dshdb::{NewEvent, Options, Store};
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;

const PROVIDER: &str = "deepseek-official";
const MODEL: &str = "deepseek-v4-flash";

/// One scripted agent round: a user prompt, a streamed answer with one tool call, the tool's
/// output, and a streamed final reply.
struct Script {
    name: &'static str,
    prompt: &'static str,
    thought: [&'static str; 3],
    tool: &'static str,
    arguments: Value,
    output: &'static str,
    reply: [&'static str; 3],
}

const EVENTS_SHOWN: u64 = 4;

fn scripts() -> Vec<Script> {
    vec![
        Script {
            name: "fix-failing-test",
            prompt: "The test `parses_empty_header` fails. Find out why and fix it.",
            thought: ["Let me run ", "the failing test ", "to see the error."],
            tool: "bash",
            arguments: json!({"command": "cargo test parses_empty_header", "description": "Run the failing test"}),
            output: "test header::parses_empty_header ... FAILED\nthread panicked at src/header.rs:41:\ncalled `Option::unwrap()` on a `None` value\n",
            reply: [
                "The header parser unwraps `cwd`, ",
                "which is optional. I changed it to ",
                "`if let Some(cwd)` and the test passes.",
            ],
        },
        Script {
            name: "summarize-readme",
            prompt: "Summarize README.md in two sentences.",
            thought: ["I will read ", "the README ", "first."],
            tool: "read",
            arguments: json!({"file_path": "README.md"}),
            output: "# tinyhttp\nA minimal HTTP/1.1 server in 400 lines of Rust.\nNo dependencies; blocking I/O; one thread per connection.\n",
            reply: [
                "tinyhttp is a dependency-free HTTP/1.1 server ",
                "in about 400 lines of Rust. It uses blocking I/O ",
                "with one thread per connection.",
            ],
        },
        Script {
            name: "list-todos",
            prompt: "How many TODO comments are left in src/?",
            thought: ["A grep ", "over src/ ", "will count them."],
            tool: "bash",
            arguments: json!({"command": "grep -rc TODO src/ | awk -F: '{s+=$2} END {print s}'", "description": "Count TODO comments"}),
            output: "7\n",
            reply: ["There are ", "7 TODO comments ", "left in src/."],
        },
    ]
}

/// An event under construction: type, data and envelope members.
struct Draft {
    event_type: &'static str,
    data: Value,
    envelope: String,
}

fn draft(event_type: &'static str, data: Value) -> Draft {
    Draft {
        event_type,
        data,
        envelope: String::new(),
    }
}

/// A surface event, with `sourceEventSeqs` before `surfaceOp` as DSH's `Session.append` writes.
fn surface(event_type: &'static str, data: Value, sources: &[u64]) -> Draft {
    let envelope = if sources.is_empty() {
        "\"surfaceOp\":\"append\"".to_string()
    } else {
        format!(
            "\"sourceEventSeqs\":{},\"surfaceOp\":\"append\"",
            json!(sources)
        )
    };
    Draft {
        event_type,
        data,
        envelope,
    }
}

fn chunk(step: u64, chunk: Value) -> Draft {
    draft(
        "assistant/chunk",
        json!({"turn": 1, "step": step, "chunk": chunk}),
    )
}

/// Streams one assistant step as chunks (text deltas, optionally a tool call) and returns the
/// drafts plus the assistant message content.
fn stream_step(
    step: u64,
    pieces: &[&str],
    tool_call: Option<&Value>,
    usage: &Value,
) -> (Vec<Draft>, Vec<Value>) {
    let text: String = pieces.concat();
    let mut drafts = vec![chunk(
        step,
        json!({"type": "block-start", "index": 0, "blockType": "text"}),
    )];
    for piece in pieces {
        drafts.push(chunk(
            step,
            json!({"type": "text-delta", "index": 0, "text": piece}),
        ));
    }
    let text_block = json!({"type": "text", "text": text});
    drafts.push(chunk(
        step,
        json!({"type": "block-end", "index": 0, "block": text_block}),
    ));
    let mut content = vec![text_block];
    if let Some(call) = tool_call {
        drafts.push(chunk(
            step,
            json!({"type": "block-start", "index": 1, "blockType": "tool-call"}),
        ));
        drafts.push(chunk(
            step,
            json!({"type": "block-end", "index": 1, "block": call}),
        ));
        content.push(call.clone());
    }
    drafts.push(chunk(step, json!({"type": "usage", "usage": usage})));
    let finish = if tool_call.is_some() {
        "tool-calls"
    } else {
        "stop"
    };
    drafts.push(chunk(
        step,
        json!({"type": "finish", "reason": {"kind": finish}}),
    ));
    (drafts, content)
}

/// The events of one scripted session, in order.
fn session_events(script: &Script, tag: &str) -> Vec<Draft> {
    let call_id = format!("call_{tag}_1");
    let model_source = json!({"kind": "model", "provider": PROVIDER, "model": MODEL});
    let mut events = vec![
        draft(
            "turn/start",
            json!({"turn": 1, "trigger": {"kind": "message", "source": {"kind": "user"}}}),
        ),
        surface(
            "user/message",
            json!({
                "role": "user",
                "content": [{"type": "text", "text": script.prompt}],
                "source": {"kind": "user"},
                "id": format!("msg_{tag}_user"),
            }),
            &[],
        ),
        draft("step/start", json!({"turn": 1, "step": 1})),
        draft(
            "request/header",
            json!({"header": {"config": {"provider": PROVIDER, "model": MODEL}}, "reason": "initial"}),
        ),
    ];
    // Step 1: the model thinks aloud and calls a tool.
    let arguments = script.arguments.to_string();
    let call =
        json!({"type": "tool-call", "id": call_id, "name": script.tool, "arguments": arguments});
    let usage = json!({"inputTokens": 812, "outputTokens": 64, "cacheReadTokens": 7680});
    let first = events.len() as u64;
    let (chunks, content) = stream_step(1, &script.thought, Some(&call), &usage);
    let sources: Vec<u64> = (first..first + chunks.len() as u64).collect();
    events.extend(chunks);
    events.push(surface(
        "assistant/message",
        json!({
            "turn": 1,
            "step": 1,
            "message": {"role": "assistant", "id": format!("msg_{tag}_a1"), "source": model_source, "content": content},
            "usage": usage,
        }),
        &sources,
    ));
    let call_seq = events.len() as u64;
    events.push(draft(
        "tool/call",
        json!({"turn": 1, "step": 1, "callId": call_id, "name": script.tool, "arguments": arguments}),
    ));
    events.push(surface(
        "tool/result",
        json!({
            "turn": 1,
            "step": 1,
            "message": {
                "role": "user",
                "id": format!("msg_{tag}_tool"),
                "source": {"kind": "tool", "callId": call_id},
                "content": [{
                    "type": "tool-result",
                    "toolCallId": call_id,
                    "content": [{"type": "text", "text": script.output}],
                    "isError": false,
                }],
            },
        }),
        &[call_seq],
    ));
    events.push(draft("step/end", json!({"turn": 1, "step": 1})));
    // Step 2: the final reply.
    events.push(draft("step/start", json!({"turn": 1, "step": 2})));
    let usage = json!({"inputTokens": 951, "outputTokens": 38, "cacheReadTokens": 8448});
    let first = events.len() as u64;
    let (chunks, content) = stream_step(2, &script.reply, None, &usage);
    let sources: Vec<u64> = (first..first + chunks.len() as u64).collect();
    events.extend(chunks);
    events.push(surface(
        "assistant/message",
        json!({
            "turn": 1,
            "step": 2,
            "message": {"role": "assistant", "id": format!("msg_{tag}_a2"), "source": model_source, "content": content},
            "usage": usage,
        }),
        &sources,
    ));
    events.push(draft("step/end", json!({"turn": 1, "step": 2})));
    events.push(draft(
        "turn/end",
        json!({"turn": 1, "reason": {"kind": "completed"}}),
    ));
    events
}

/// A session id not yet in the store: `quickstart-NAME`, then `quickstart-NAME-2`, ...
fn fresh_id(store: &Store, name: &str) -> String {
    let base = format!("quickstart-{name}");
    let mut id = base.clone();
    let mut counter = 2;
    while store.session(&id).is_ok() {
        id = format!("{base}-{counter}");
        counter += 1;
    }
    id
}

pub fn run(dir: &Path, out: &mut impl Write) -> Result<()> {
    let store = Store::open(dir, Options::default())
        .with_context(|| format!("cannot create or open a store at {}", dir.display()))?;
    let existing = store.sessions().len();
    writeln!(
        out,
        "store {} ({} existing sessions)",
        dir.display(),
        existing
    )?;
    let mut written = Vec::new();
    let mut time = now_millis();
    for (index, script) in scripts().iter().enumerate() {
        let id = fresh_id(&store, script.name);
        let header =
            json!({"version": 0, "id": id, "createdAt": time, "cwd": "/home/demo/project"});
        let mut writer = store
            .create_session(&header.to_string())
            .with_context(|| format!("creating session {id}"))?;
        let tag = format!("{}{index}", time % 100_000);
        let drafts = session_events(script, &tag);
        // Append one event at a time, as an agent loop does while it streams.
        for draft in &drafts {
            time += 1;
            let data = draft.data.to_string();
            let event = NewEvent {
                time: Some(time),
                envelope: &draft.envelope,
                ..NewEvent::new(draft.event_type, &data)
            };
            writer
                .append(event)
                .with_context(|| format!("appending {} to {id}", draft.event_type))?;
        }
        writeln!(out, "wrote session {id}: {} events", drafts.len())?;
        written.push(id);
        time += 1000;
    }
    store.close().context("closing the store")?;
    writeln!(out, "closed the store; reopening it read-only")?;

    let options = Options {
        read_only: true,
        create_if_missing: false,
        ..Options::default()
    };
    let store = Store::open(dir, options).context("reopening the store")?;
    writeln!(out, "{}", read_back_line(&store))?;
    for id in &written {
        let summary = store.session(id)?;
        writeln!(out)?;
        writeln!(out, "session {id}: {} events", summary.events)?;
        writeln!(out, "header: {}", summary.header_json)?;
        let from = summary.events.saturating_sub(EVENTS_SHOWN);
        writeln!(out, "last {} events:", summary.events - from)?;
        for event in store.read(id, from, summary.events)? {
            writeln!(out, "{}", event.to_json_line())?;
        }
    }
    let example = written.first().map(String::as_str).unwrap_or("SESSION");
    let dshdb = invocation();
    writeln!(out)?;
    writeln!(out, "next:")?;
    writeln!(out, "  {dshdb} ls {}", dir.display())?;
    writeln!(
        out,
        "  {dshdb} events {} {example} --type tool/result",
        dir.display()
    )?;
    writeln!(out, "  {dshdb} verify {}", dir.display())?;
    if dshdb != "dshdb" {
        writeln!(
            out,
            "(`cargo install --path cli` puts `dshdb` on your PATH; until then run {dshdb})"
        )?;
    }
    Ok(())
}

/// What the read-only reopen found, and from where: after a clean close the seq index comes
/// from its checkpoint, so recovery scans no segment and the counts come from the catalog.
fn read_back_line(store: &Store) -> String {
    let sessions = store.sessions();
    let events: u64 = sessions.iter().map(|session| session.events).sum();
    let report = store.recovery_report();
    let source = if report.checkpoint_used {
        format!(
            "the seq-index checkpoint (it covers {} sealed segment(s), so recovery scanned {})",
            report.segments_covered, report.segments_scanned
        )
    } else {
        format!(
            "recovery ({} segments scanned, {} runs decoded)",
            report.segments_scanned, report.runs_replayed
        )
    };
    format!(
        "read back: {} sessions, {events} events, indexed from {source}",
        sessions.len()
    )
}

/// How to run this binary again: `dshdb` when it is the one on PATH, else its own path.
fn invocation() -> String {
    let Ok(executable) = std::env::current_exe() else {
        return "dshdb".to_owned();
    };
    let on_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|directory| {
            let candidate = directory.join("dshdb");
            candidate.canonicalize().ok() == executable.canonicalize().ok() && candidate.is_file()
        })
    });
    if on_path {
        return "dshdb".to_owned();
    }
    let relative = std::env::current_dir()
        .ok()
        .and_then(|current| executable.strip_prefix(current).ok().map(Path::to_path_buf));
    match relative {
        Some(relative) => relative.display().to_string(),
        None => executable.display().to_string(),
    }
}
