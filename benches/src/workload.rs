//! Seeded, reproducible event streams shaped like DSH session logs.
//!
//! Two shapes:
//! - [`Shape::Dsh`]: the event-type mix and payload sizes of the DSH fixtures
//!   (`/work/shared/fixtures/dsh/*.input.jsonl`): per turn a `user/message`, `turn/start`, then
//!   1–4 steps of `step/start`, a run of small `assistant/chunk` deltas (median ~85 B of data),
//!   an `assistant/message` (~200 B–2.5 KiB), usually a `tool/call` (~170 B) and `tool/result`
//!   (~300 B, 5 % of them 8–64 KiB), `step/end`, and finally `turn/end`.
//! - [`Shape::Fixed`]: `assistant/chunk` events whose `data` JSON text is exactly N bytes.
//!
//! The PRNG is splitmix64: the same seed gives the same stream on every machine.

use std::collections::VecDeque;

/// splitmix64: small, fast, good enough for workload shaping.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        if hi <= lo {
            return lo;
        }
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 > 1.0 - p
    }

    /// Roughly log-uniform in `lo..=hi` (payload sizes are heavy-tailed).
    pub fn log_range(&mut self, lo: usize, hi: usize) -> usize {
        let lo_f = (lo.max(1) as f64).ln();
        let hi_f = (hi.max(lo + 1) as f64).ln();
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        (lo_f + (hi_f - lo_f) * unit).exp().round() as usize
    }
}

/// One generated event: a DSH type and its `data` JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenEvent {
    pub event_type: &'static str,
    pub data: String,
    /// DSH envelope members after `data`, without braces (e.g. `"surfaceOp":"append"`); empty
    /// for none.
    pub envelope: String,
}

impl GenEvent {
    /// The event as a dshdb append (type, data and envelope; time now).
    pub fn as_new_event(&self) -> dshdb::store::NewEvent<'_> {
        dshdb::store::NewEvent {
            envelope: &self.envelope,
            ..dshdb::store::NewEvent::new(self.event_type, &self.data)
        }
    }

    /// The event as the DSH JSONL line `JSON.stringify(event)` writes (raw encoding, with `\n`):
    /// `{type, seq, time, data, sourceEventSeqs?, surfaceOp?}`, the order of DSH's `Session.append`.
    pub fn jsonl_line(&self, seq: u64, time: i64) -> String {
        let separator = if self.envelope.is_empty() { "" } else { "," };
        format!(
            "{{\"type\":\"{}\",\"seq\":{},\"time\":{},\"data\":{}{separator}{}}}\n",
            self.event_type, seq, time, self.data, self.envelope
        )
    }
}

/// What the stream looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The DSH fixture mix.
    Dsh,
    /// `assistant/chunk` events with exactly this many bytes of `data` JSON.
    Fixed(usize),
}

/// Share of tool results that are 1–4 MiB (a build log, a file dump): rare, but the ones that
/// make a session hundreds of MB.
const MEGABYTE_OUTPUT_CHANCE: f64 = 0.000_5;

/// The envelope of an event that appends a surface node.
const APPEND: &str = "\"surfaceOp\":\"append\"";

/// The events of one session, generated lazily turn by turn.
pub struct SessionStream {
    rng: Rng,
    shape: Shape,
    turn: u64,
    pending: VecDeque<GenEvent>,
    call: u64,
    /// Seq the next generated event gets when the stream is appended from seq 0 (the DSH
    /// shape's `sourceEventSeqs` cite earlier events by it).
    next_seq: u64,
}

/// Random ASCII "text" of `len` bytes, JSON-safe (no quotes or backslashes).
pub fn text(rng: &mut Rng, len: usize) -> String {
    const WORDS: [&str; 16] = [
        "the ", "file ", "tool ", "result ", "model ", "agent ", "index ", "error ", "build ",
        "check ", "write ", "read ", "src/", "main.rs ", "ok. ", "line\\n",
    ];
    let mut out = String::with_capacity(len + 8);
    while out.len() < len {
        out.push_str(WORDS[(rng.next_u64() & 15) as usize]);
    }
    // Never cut inside the `\n` escape.
    out.truncate(len);
    if out.ends_with('\\') {
        out.pop();
        out.push('x');
    }
    out
}

impl SessionStream {
    /// The stream of session `index` under workload `seed`.
    pub fn new(seed: u64, index: u64, shape: Shape) -> SessionStream {
        SessionStream {
            rng: Rng::new(seed.wrapping_mul(0x1000_0000_01B3) ^ index.wrapping_add(1)),
            shape,
            turn: 0,
            pending: VecDeque::new(),
            call: 0,
            next_seq: 0,
        }
    }

    pub fn next_event(&mut self) -> GenEvent {
        if let Shape::Fixed(size) = self.shape {
            return fixed_event(&mut self.rng, size);
        }
        if self.pending.is_empty() {
            self.generate_turn();
        }
        self.pending.pop_front().expect("a turn has events")
    }

    /// Next `n` events.
    pub fn take(&mut self, n: usize) -> Vec<GenEvent> {
        (0..n).map(|_| self.next_event()).collect()
    }

    /// Queues an event; returns the seq it will get.
    fn push(&mut self, event_type: &'static str, data: String) -> u64 {
        self.push_with(event_type, data, String::new())
    }

    fn push_with(&mut self, event_type: &'static str, data: String, envelope: String) -> u64 {
        self.pending.push_back(GenEvent {
            event_type,
            data,
            envelope,
        });
        self.next_seq += 1;
        self.next_seq - 1
    }

    fn message_id(&mut self) -> String {
        format!("msg-{:016x}", self.rng.next_u64())
    }

    fn generate_turn(&mut self) {
        self.turn += 1;
        let turn = self.turn;
        let rng = &mut self.rng;
        let user_len = if rng.chance(0.03) {
            rng.log_range(4_000, 54_000)
        } else {
            rng.log_range(40, 1_500)
        };
        let user = text(rng, user_len);
        let id = self.message_id();
        self.push_with(
            "user/message",
            format!("{{\"content\":[{{\"type\":\"text\",\"text\":\"{user}\"}}],\"source\":{{\"kind\":\"user\"}},\"role\":\"user\",\"id\":\"{id}\"}}"),
            APPEND.to_string(),
        );
        self.push("turn/start", format!("{{\"turn\":{turn}}}"));
        let steps = self.rng.range(1, 4);
        for step in 1..=steps {
            self.push("step/start", format!("{{\"turn\":{turn},\"step\":{step}}}"));
            let chunks = self.rng.range(5, 60);
            let first_chunk = self.push(
                "assistant/chunk",
                format!("{{\"turn\":{turn},\"step\":{step},\"chunk\":{{\"type\":\"block-start\",\"index\":0,\"blockType\":\"text\"}}}}"),
            );
            let mut message = String::new();
            for _ in 0..chunks {
                let delta_len = self.rng.log_range(1, 40);
                let delta = text(&mut self.rng, delta_len);
                message.push_str(&delta);
                let kind = if self.rng.chance(0.4) {
                    "reasoning-delta"
                } else {
                    "text-delta"
                };
                self.push(
                    "assistant/chunk",
                    format!("{{\"turn\":{turn},\"step\":{step},\"chunk\":{{\"type\":\"{kind}\",\"index\":0,\"text\":\"{delta}\"}}}}"),
                );
            }
            let last_chunk = self.push(
                "assistant/chunk",
                format!("{{\"turn\":{turn},\"step\":{step},\"chunk\":{{\"type\":\"block-end\",\"index\":0}}}}"),
            );
            let tool = step < steps || self.rng.chance(0.3);
            self.call += 1;
            let call_id = format!("call_{:016x}", self.rng.next_u64());
            let arguments_len = self.rng.log_range(20, 400);
            let arguments = text(&mut self.rng, arguments_len);
            let tool_part = if tool {
                format!(",{{\"type\":\"tool-call\",\"id\":\"{call_id}\",\"name\":\"bash\",\"arguments\":\"{arguments}\"}}")
            } else {
                String::new()
            };
            let id = self.message_id();
            let (input_tokens, output_tokens) =
                (self.rng.range(1_000, 60_000), message.len() / 4 + 1);
            let cited: Vec<String> = (first_chunk..=last_chunk)
                .map(|seq| seq.to_string())
                .collect();
            self.push_with(
                "assistant/message",
                format!("{{\"turn\":{turn},\"step\":{step},\"message\":{{\"role\":\"assistant\",\"content\":[{{\"type\":\"text\",\"text\":\"{message}\"}}{tool_part}],\"source\":{{\"kind\":\"model\",\"provider\":\"deepseek\",\"model\":\"deepseek-v4-flash\"}},\"id\":\"{id}\"}},\"usage\":{{\"inputTokens\":{input_tokens},\"outputTokens\":{output_tokens}}}}}"),
                format!("\"sourceEventSeqs\":[{}],{APPEND}", cited.join(",")),
            );
            if tool {
                let call_seq = self.push(
                    "tool/call",
                    format!("{{\"turn\":{turn},\"step\":{step},\"callId\":\"{call_id}\",\"name\":\"bash\",\"arguments\":\"{arguments}\"}}"),
                );
                let output_len = if self.rng.chance(MEGABYTE_OUTPUT_CHANCE) {
                    self.rng.log_range(1 << 20, 4 << 20)
                } else if self.rng.chance(0.05) {
                    self.rng.log_range(8 * 1024, 64 * 1024)
                } else {
                    self.rng.log_range(10, 1_000)
                };
                let output = text(&mut self.rng, output_len);
                let id = self.message_id();
                self.push_with(
                    "tool/result",
                    format!("{{\"turn\":{turn},\"step\":{step},\"message\":{{\"source\":{{\"kind\":\"tool\",\"callId\":\"{call_id}\"}},\"content\":[{{\"type\":\"tool-result\",\"toolCallId\":\"{call_id}\",\"content\":[{{\"type\":\"text\",\"text\":\"{output}\"}}],\"isError\":false}}],\"role\":\"user\",\"id\":\"{id}\"}}}}"),
                    format!("\"sourceEventSeqs\":[{call_seq}],{APPEND}"),
                );
            }
            self.push("step/end", format!("{{\"turn\":{turn},\"step\":{step}}}"));
        }
        self.push(
            "turn/end",
            format!("{{\"turn\":{turn},\"reason\":{{\"kind\":\"completed\"}}}}"),
        );
    }
}

/// An `assistant/chunk` whose data JSON text is exactly `size` bytes (at least 64).
pub fn fixed_event(rng: &mut Rng, size: usize) -> GenEvent {
    let prefix =
        "{\"turn\":1,\"step\":1,\"chunk\":{\"type\":\"text-delta\",\"index\":0,\"text\":\"";
    let suffix = "\"}}";
    let body = size.saturating_sub(prefix.len() + suffix.len());
    let data = format!("{prefix}{}{suffix}", text(rng, body));
    GenEvent {
        event_type: "assistant/chunk",
        data,
        envelope: String::new(),
    }
}

/// Id in the header of [`session_jsonl`].
pub const SESSION_JSONL_ID: &str = "bench-exchange";

/// First event time (ms since the epoch) of the generated session.
const START_TIME_MS: i64 = 1_786_000_000_000;

/// One generated session as DSH's raw JSONL writer writes it.
pub fn session_jsonl(seed: u64, events: usize) -> Vec<u8> {
    let mut stream = SessionStream::new(seed, 1, Shape::Dsh);
    let mut out = format!(
        "{{\"type\":\"session\",\"version\":0,\"id\":\"{SESSION_JSONL_ID}\",\"createdAt\":{START_TIME_MS},\"cwd\":\"/home/bench/project\",\"delegationDepth\":0}}\n"
    )
    .into_bytes();
    for seq in 0..events {
        let event = stream.next_event();
        let time = START_TIME_MS + i64::try_from(seq).unwrap_or(i64::MAX);
        let seq = u64::try_from(seq).unwrap_or(u64::MAX);
        out.extend_from_slice(event.jsonl_line(seq, time).as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_valid_json() {
        let a = SessionStream::new(7, 3, Shape::Dsh).take(500);
        let b = SessionStream::new(7, 3, Shape::Dsh).take(500);
        assert_eq!(a, b);
        for event in &a {
            serde_json::from_str::<serde_json::Value>(&event.data).expect("valid JSON");
        }
        let c = SessionStream::new(7, 4, Shape::Dsh).take(500);
        assert_ne!(a, c);
    }

    #[test]
    fn fixed_events_have_exact_size() {
        for size in [256, 1024] {
            let mut stream = SessionStream::new(1, 0, Shape::Fixed(size));
            for _ in 0..50 {
                let event = stream.next_event();
                assert_eq!(event.data.len(), size);
                serde_json::from_str::<serde_json::Value>(&event.data).expect("valid JSON");
            }
        }
    }

    #[test]
    fn dsh_shape_is_a_valid_dsh_session_and_round_trips_byte_identically() {
        let jsonl = session_jsonl(3, 3_000);
        let dir = std::env::temp_dir().join(format!("dshdb-workload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store =
            dshdb::store::Store::open(&dir, dshdb::store::Options::default()).expect("open");
        let report = dshdb::exchange::import_dsh_jsonl(&store, &jsonl).expect("DSH-valid");
        assert_eq!(report.events, 3_000);
        assert_eq!(report.verbatim, 0, "DSH's own key order re-renders exactly");
        let exported = dshdb::exchange::export_dsh_jsonl(&store, SESSION_JSONL_ID).expect("export");
        assert!(exported == jsonl, "export differs from the generated JSONL");
        let messages = dshdb::derive::messages(&store, SESSION_JSONL_ID).expect("messages");
        assert!(messages.len() > 100, "{} messages", messages.len());
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn dsh_mix_is_mostly_chunks() {
        let events = SessionStream::new(1, 0, Shape::Dsh).take(5_000);
        let chunks = events
            .iter()
            .filter(|event| event.event_type == "assistant/chunk")
            .count();
        assert!(chunks * 2 > events.len(), "{chunks} of {}", events.len());
    }
}
