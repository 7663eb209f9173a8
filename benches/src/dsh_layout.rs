//! A session written the way DSH's JSONL backend writes it: consecutive chunk deltas of one
//! block packed into one storage row (`packChunks`, persistence §2.4) per durable batch, and
//! `session.jsonl.zstd` holding one zstd frame per batch (§2.7). Batches follow DSH's
//! write-behind (§4.2): a fixed 200 ms window from the first pending event, closed early by the
//! flushes DSH's checkpoint policy makes before a step, before the model stream and before a
//! tool runs (§4.3).
//!
//! The event shapes are those of the DSH-written fixtures (`shared/fixtures/dsh/*.session.*`,
//! DSH 0.1.1): `assistant/message` with `content`, `provenance`, `usage` and `sourceEventSeqs`
//! citing its chunks; `block-end` chunks carrying the whole block; `tool/result` with
//! `callId`. Lines are written in DSH's live key order (`type, seq, time, data, <envelope>`).
//!
//! [`pack_batch`] is the row packer; a test checks that it reproduces the DSH-written
//! fixtures byte for byte from their expanded events.

use crate::workload::Rng;
use std::fmt::Write as _;

/// DSH packs runs of at least this many members (`MIN_RUN`).
pub const MIN_RUN: usize = 3;
/// DSH's write-behind window (`writeBatchMaxDelayMs` default), in ms.
pub const BATCH_WINDOW_MS: i64 = 200;
/// Largest integer JavaScript represents exactly.
const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;
/// Id in the header of the generated session.
pub const SESSION_ID: &str = "bench-dsh-layout";
/// `createdAt` of the generated session (ms since the epoch).
const CREATED_AT_MS: i64 = 1_786_000_000_000;
/// DSH compresses with Node's default zstd level, checksums on.
const ZSTD_LEVEL: i32 = 3;

/// Which packed row a chunk delta belongs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeltaKind {
    Text,
    Reasoning,
    /// A tool-call delta: its `id` and optional `name`, as JSON string literals.
    ToolCall {
        id: String,
        name: Option<String>,
    },
}

impl DeltaKind {
    fn row_tag(&self) -> &'static str {
        match self {
            DeltaKind::Text => "text-chunks",
            DeltaKind::Reasoning => "reasoning-chunks",
            DeltaKind::ToolCall { .. } => "tool-call-chunks",
        }
    }
}

/// A chunk event DSH's writer may pack: the raw JSON texts of its shared fields and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    pub turn: String,
    pub step: String,
    pub index: String,
    pub kind: DeltaKind,
    /// The `text` / `argumentsDelta` JSON string literal.
    pub payload: String,
}

/// One event of a batch: its line as DSH writes it unpacked, and its delta when eligible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageEvent {
    pub seq: u64,
    pub time: i64,
    /// The event's line, without `\n`.
    pub line: String,
    pub delta: Option<Delta>,
}

/// Lines and packed rows written by [`pack_batch`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackCounts {
    pub lines: u64,
    pub rows: u64,
}

/// Whether `next` continues the run that `previous` is in (§2.4 "a run continues").
/// Numbers are compared by their text: DSH's writer prints them itself, so equal values
/// have equal texts.
fn continues(previous: &StorageEvent, next: &StorageEvent) -> bool {
    let (Some(a), Some(b)) = (&previous.delta, &next.delta) else {
        return false;
    };
    let gap_safe = next
        .time
        .checked_sub(previous.time)
        .is_some_and(|gap| gap.abs() <= MAX_SAFE_INTEGER);
    a.kind == b.kind
        && next.seq == previous.seq + 1
        && gap_safe
        && a.turn == b.turn
        && a.step == b.step
        && a.index == b.index
}

/// Appends one packed row line (with `\n`) for `run` (all deltas of one run).
fn write_row(run: &[StorageEvent], out: &mut Vec<u8>) {
    let (
        Some(first),
        Some(Delta {
            turn,
            step,
            index,
            kind,
            ..
        }),
    ) = (
        run.first(),
        run.first().and_then(|event| event.delta.as_ref()),
    )
    else {
        return;
    };
    let mut text = String::with_capacity(64 + run.len() * 12);
    let _ = write!(
        text,
        "{{\"type\":\"{}\",\"seq0\":{},\"time0\":{},\"data\":{{\"turn\":{turn},\"step\":{step},\"index\":{index},\"dt\":[",
        kind.row_tag(),
        first.seq,
        first.time
    );
    for (position, pair) in run.windows(2).enumerate() {
        if position > 0 {
            text.push(',');
        }
        let _ = write!(text, "{}", pair[1].time - pair[0].time);
    }
    text.push(']');
    let payload_key = match kind {
        DeltaKind::ToolCall { id, name } => {
            let _ = write!(text, ",\"id\":{id}");
            if let Some(name) = name {
                let _ = write!(text, ",\"name\":{name}");
            }
            "args"
        }
        DeltaKind::Text | DeltaKind::Reasoning => "texts",
    };
    let _ = write!(text, ",\"{payload_key}\":[");
    for (position, event) in run.iter().enumerate() {
        if position > 0 {
            text.push(',');
        }
        if let Some(delta) = &event.delta {
            text.push_str(&delta.payload);
        }
    }
    text.push_str("]}}\n");
    out.extend_from_slice(text.as_bytes());
}

/// Writes one durable batch as DSH's JSONL writer does: maximal runs of at least
/// [`MIN_RUN`] continuing deltas as one row each, every other event as its own line.
pub fn pack_batch(events: &[StorageEvent], out: &mut Vec<u8>) -> PackCounts {
    let mut counts = PackCounts::default();
    let mut start = 0;
    while start < events.len() {
        let mut end = start + 1;
        if events[start].delta.is_some() {
            while end < events.len() && continues(&events[end - 1], &events[end]) {
                end += 1;
            }
        }
        counts.lines += 1;
        if end - start >= MIN_RUN {
            write_row(&events[start..end], out);
            counts.rows += 1;
            start = end;
        } else {
            out.extend_from_slice(events[start].line.as_bytes());
            out.push(b'\n');
            start += 1;
        }
    }
    counts
}

/// A generated DSH-layout session.
#[derive(Debug, Clone)]
pub struct DshLayout {
    /// `session.jsonl`: the header line, then every batch packed.
    pub jsonl: Vec<u8>,
    /// Plaintext offset where each batch starts (the header line is batch 0 at offset 0).
    pub batch_starts: Vec<usize>,
    pub events: u64,
    pub lines: u64,
    pub rows: u64,
}

impl DshLayout {
    /// `session.jsonl.zstd`: one frame for the header line, then one frame per batch.
    pub fn zstd(&self) -> std::io::Result<Vec<u8>> {
        let mut compressor = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
        compressor.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
        let mut out = Vec::with_capacity(self.jsonl.len() / 2);
        let mut ends = self
            .batch_starts
            .iter()
            .skip(1)
            .copied()
            .collect::<Vec<_>>();
        ends.push(self.jsonl.len());
        let mut start = 0;
        for end in ends {
            out.extend(compressor.compress(&self.jsonl[start..end])?);
            start = end;
        }
        Ok(out)
    }

    /// Zstd frames of [`DshLayout::zstd`] (the header's included).
    pub fn frames(&self) -> usize {
        self.batch_starts.len()
    }
}

/// Why the pending batch is written now, besides its window expiring (§4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flush {
    None,
    /// Write what is pending before this event is admitted (a checkpoint-policy flush).
    Before,
}

/// Builds the session event by event, batching as DSH's write-behind does.
struct Builder {
    rng: Rng,
    vocabulary: Vec<String>,
    time: i64,
    seq: u64,
    pending: Vec<StorageEvent>,
    window_end: i64,
    out: DshLayout,
}

/// Distinct words of the generated text (a Zipf-like pick over them).
const VOCABULARY_WORDS: usize = 1_000;

fn json_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_owned())
}

impl Builder {
    fn new(seed: u64) -> Builder {
        let mut rng = Rng::new(seed ^ 0xD5A7_0001);
        let vocabulary = (0..VOCABULARY_WORDS)
            .map(|_| {
                let len = rng.log_range(1, 11);
                (0..len)
                    .map(|_| char::from(b'a' + (rng.next_u64() % 26) as u8))
                    .collect()
            })
            .collect();
        let header = format!(
            "{{\"type\":\"session\",\"version\":0,\"id\":\"{SESSION_ID}\",\"createdAt\":{CREATED_AT_MS},\"cwd\":\"/home/bench/project\",\"delegationDepth\":0}}\n"
        );
        Builder {
            rng,
            vocabulary,
            time: CREATED_AT_MS,
            seq: 0,
            pending: Vec::new(),
            window_end: 0,
            out: DshLayout {
                jsonl: header.into_bytes(),
                batch_starts: vec![0],
                events: 0,
                lines: 0,
                rows: 0,
            },
        }
    }

    fn word(&mut self) -> &str {
        // Cubing a uniform draw favours the first words, as natural text does.
        let unit = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let index = ((unit * unit * unit) * self.vocabulary.len() as f64) as usize;
        &self.vocabulary[index.min(self.vocabulary.len() - 1)]
    }

    /// About `len` bytes of prose (unescaped).
    fn prose(&mut self, len: usize) -> String {
        let mut out = String::with_capacity(len + 12);
        while out.len() < len {
            let roll = self.rng.next_u64() % 100;
            let word = self.word().to_owned();
            out.push_str(&word);
            out.push_str(match roll {
                0..=5 => ". ",
                6..=8 => ",\n",
                9 => "\n\n",
                10 => "\"",
                _ => " ",
            });
        }
        out
    }

    /// A model delta token (unescaped): a word with its leading space, sometimes punctuation.
    fn token(&mut self) -> String {
        match self.rng.next_u64() % 20 {
            0 => ".".to_owned(),
            1 => ",".to_owned(),
            2 => "\n".to_owned(),
            3 => format!("`{}", self.word()),
            _ => format!(" {}", self.word()),
        }
    }

    /// Writes the pending batch.
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        self.out.batch_starts.push(self.out.jsonl.len());
        let counts = pack_batch(&self.pending, &mut self.out.jsonl);
        self.out.lines += counts.lines;
        self.out.rows += counts.rows;
        self.out.events += self.pending.len() as u64;
        self.pending.clear();
    }

    /// Admits an event `after_ms` after the previous one; returns its seq.
    fn push(
        &mut self,
        after_ms: i64,
        event_type: &str,
        data: &str,
        envelope: &str,
        delta: Option<Delta>,
        flush: Flush,
    ) -> u64 {
        self.time += after_ms;
        if flush == Flush::Before || (!self.pending.is_empty() && self.time >= self.window_end) {
            self.flush();
        }
        if self.pending.is_empty() {
            self.window_end = self.time + BATCH_WINDOW_MS;
        }
        let seq = self.seq;
        self.seq += 1;
        let separator = if envelope.is_empty() { "" } else { "," };
        let line = format!(
            "{{\"type\":\"{event_type}\",\"seq\":{seq},\"time\":{},\"data\":{data}{separator}{envelope}}}",
            self.time
        );
        self.pending.push(StorageEvent {
            seq,
            time: self.time,
            line,
            delta,
        });
        seq
    }

    /// Gap between two streamed deltas, ms: tokens often arrive together (0 ms), else a few ms apart, rarely a clock
    /// step back (DSH keeps negative `dt`s).
    fn delta_gap(&mut self) -> i64 {
        match self.rng.next_u64() % 10_000 {
            0 => -(self.rng.range(1, 20) as i64),
            1..=3_500 => 0,
            3_501..=7_000 => self.rng.range(1, 3) as i64,
            _ => self.rng.range(8, 30) as i64,
        }
    }

    /// One streamed block: block-start, its deltas, block-end. Returns the block's text.
    fn stream_block(
        &mut self,
        turn: u64,
        step: u64,
        index: u64,
        block: &str,
        kind: DeltaKind,
        deltas: usize,
    ) -> String {
        let head = format!("{{\"turn\":{turn},\"step\":{step},\"chunk\":");
        let start_gap = self.rng.range(1, 30) as i64;
        self.push(
            start_gap,
            "assistant/chunk",
            &format!(
                "{head}{{\"type\":\"block-start\",\"index\":{index},\"blockType\":\"{block}\"}}}}"
            ),
            "",
            None,
            Flush::None,
        );
        let mut whole = String::new();
        for _ in 0..deltas {
            let token = self.token();
            whole.push_str(&token);
            let payload = json_string(&token);
            let chunk = match &kind {
                DeltaKind::Text => {
                    format!("{{\"type\":\"text-delta\",\"index\":{index},\"text\":{payload}}}")
                }
                DeltaKind::Reasoning => {
                    format!("{{\"type\":\"reasoning-delta\",\"index\":{index},\"text\":{payload}}}")
                }
                DeltaKind::ToolCall { id, name } => {
                    let name = name
                        .as_ref()
                        .map(|name| format!(",\"name\":{name}"))
                        .unwrap_or_default();
                    format!("{{\"type\":\"tool-call-delta\",\"index\":{index},\"id\":{id}{name},\"argumentsDelta\":{payload}}}")
                }
            };
            let delta = Delta {
                turn: turn.to_string(),
                step: step.to_string(),
                index: index.to_string(),
                kind: kind.clone(),
                payload,
            };
            let gap = self.delta_gap();
            self.push(
                gap,
                "assistant/chunk",
                &format!("{head}{chunk}}}"),
                "",
                Some(delta),
                Flush::None,
            );
        }
        let block_json = match &kind {
            DeltaKind::ToolCall { id, name } => format!(
                "{{\"type\":\"tool-call\",\"id\":{id},\"name\":{},\"arguments\":{}}}",
                name.as_deref().unwrap_or("\"\""),
                json_string(&whole)
            ),
            _ => format!("{{\"type\":\"{block}\",\"text\":{}}}", json_string(&whole)),
        };
        let end_gap = self.rng.range(1, 5) as i64;
        self.push(
            end_gap,
            "assistant/chunk",
            &format!("{head}{{\"type\":\"block-end\",\"index\":{index},\"block\":{block_json}}}}}"),
            "",
            None,
            Flush::None,
        );
        whole
    }

    /// Tool output text (unescaped): a few lines, rarely very large (a build log, a file dump).
    fn tool_output(&mut self) -> String {
        let len = match self.rng.next_u64() % 100 {
            0..=3 => self.rng.log_range(30_000, 200_000),
            _ => self.rng.log_range(40, 28_000),
        };
        let mut out = String::with_capacity(len + 80);
        while out.len() < len {
            let words = self.rng.range(2, 12);
            // Output lines of one tool repeat a few paths, as a grep or build log does.
            let path = self.vocabulary[self.rng.range(0, 40)].clone();
            let line = self.rng.range(1, 4000);
            let _ = write!(out, "src/{path}.rs:{line}: ");
            for _ in 0..words {
                let word = self.word().to_owned();
                out.push_str(&word);
                out.push(' ');
            }
            out.push('\n');
        }
        out
    }

    fn step(&mut self, turn: u64, step: u64, last: bool) {
        let start_gap = self.rng.range(2, 40) as i64;
        self.push(
            start_gap,
            "step/start",
            &format!("{{\"turn\":{turn},\"step\":{step}}}"),
            "",
            None,
            Flush::Before,
        );
        // The model stream starts after a request round trip (and a flush before it).
        let reasoning_deltas = self.rng.log_range(30, 700);
        let first_chunk_gap = self.rng.range(300, 1_500) as i64;
        self.time += first_chunk_gap - 1;
        self.flush();
        let first_chunk = self.seq;
        let reasoning = self.stream_block(
            turn,
            step,
            0,
            "reasoning",
            DeltaKind::Reasoning,
            reasoning_deltas,
        );
        let tool = !last || self.rng.chance(0.2);
        let mut content = format!(
            "[{{\"type\":\"reasoning\",\"text\":{}}}",
            json_string(&reasoning)
        );
        let mut next_index = 1;
        if !tool || self.rng.chance(0.4) {
            let text_deltas = self.rng.log_range(15, 560);
            let text = self.stream_block(turn, step, 1, "text", DeltaKind::Text, text_deltas);
            let _ = write!(
                content,
                ",{{\"type\":\"text\",\"text\":{}}}",
                json_string(&text)
            );
            next_index = 2;
        }
        let mut call = None;
        if tool {
            let call_id = json_string(&format!("call_00_{:016x}", self.rng.next_u64()));
            let name =
                json_string(["bash", "read", "edit", "grep", "run_code"][self.rng.range(0, 4)]);
            let arguments_deltas = self.rng.log_range(12, 420);
            let kind = DeltaKind::ToolCall {
                id: call_id.clone(),
                name: Some(name.clone()),
            };
            let arguments =
                self.stream_block(turn, step, next_index, "tool-call", kind, arguments_deltas);
            let arguments = json_string(&arguments);
            let _ = write!(content, ",{{\"type\":\"tool-call\",\"id\":{call_id},\"name\":{name},\"arguments\":{arguments}}}");
            call = Some((call_id, name, arguments));
        }
        content.push(']');
        let usage = format!(
            "{{\"inputTokens\":{},\"outputTokens\":{},\"cacheReadTokens\":{},\"reasoningTokens\":{}}}",
            self.rng.range(1_000, 120_000),
            self.rng.range(10, 4_000),
            self.rng.range(0, 100_000),
            self.rng.range(0, 2_000)
        );
        let head = format!("{{\"turn\":{turn},\"step\":{step},\"chunk\":");
        self.push(
            1,
            "assistant/chunk",
            &format!("{head}{{\"type\":\"usage\",\"usage\":{usage}}}}}"),
            "",
            None,
            Flush::None,
        );
        let reason = if tool { "tool-calls" } else { "stop" };
        let finish = self.push(
            1,
            "assistant/chunk",
            &format!("{head}{{\"type\":\"finish\",\"reason\":{{\"kind\":\"{reason}\"}}}}}}"),
            "",
            None,
            Flush::None,
        );
        let cited: Vec<String> = (first_chunk..=finish).map(|seq| seq.to_string()).collect();
        self.push(
            1,
            "assistant/message",
            &format!("{{\"turn\":{turn},\"step\":{step},\"content\":{content},\"provenance\":{{\"provider\":\"deepseek-official\",\"model\":\"deepseek-v4-flash\"}},\"usage\":{usage}}}"),
            &format!("\"sourceEventSeqs\":[{}],\"surfaceOp\":\"append\"", cited.join(",")),
            None,
            Flush::None,
        );
        if let Some((call_id, name, arguments)) = call {
            let call_seq = self.push(
                1,
                "tool/call",
                &format!("{{\"turn\":{turn},\"step\":{step},\"callId\":{call_id},\"name\":{name},\"arguments\":{arguments}}}"),
                "",
                None,
                Flush::None,
            );
            // The checkpoint policy flushes before the tool body runs.
            self.flush();
            let output = json_string(&self.tool_output());
            let run_ms = self.rng.log_range(20, 8_000) as i64;
            self.push(
                run_ms,
                "tool/result",
                &format!("{{\"turn\":{turn},\"step\":{step},\"callId\":{call_id},\"content\":[{{\"type\":\"text\",\"text\":{output}}}],\"isError\":false}}"),
                &format!("\"sourceEventSeqs\":[{call_seq}],\"surfaceOp\":\"append\""),
                None,
                Flush::None,
            );
        }
        self.push(
            1,
            "step/end",
            &format!("{{\"turn\":{turn},\"step\":{step}}}"),
            "",
            None,
            Flush::None,
        );
    }

    fn turn(&mut self, turn: u64) {
        let think_ms = self.rng.log_range(2_000, 120_000) as i64;
        let rpc = format!("rpc-{:08x}", self.rng.next_u64() & 0xFFFF_FFFF);
        self.push(
            think_ms,
            "turn/start",
            &format!("{{\"turn\":{turn},\"trigger\":{{\"kind\":\"message\",\"source\":{{\"kind\":\"user\",\"rpcId\":\"{rpc}\"}}}}}}"),
            "",
            None,
            Flush::Before,
        );
        let prompt_len = self.rng.log_range(30, 3_000);
        let prompt = json_string(&self.prose(prompt_len));
        self.push(
            1,
            "user/message",
            &format!("{{\"content\":[{{\"type\":\"text\",\"text\":{prompt}}}],\"source\":{{\"kind\":\"user\",\"rpcId\":\"{rpc}\"}}}}"),
            "\"surfaceOp\":\"append\"",
            None,
            Flush::None,
        );
        let steps = self.rng.range(1, 6) as u64;
        for step in 1..=steps {
            self.step(turn, step, step == steps);
        }
        self.push(
            1,
            "turn/end",
            &format!("{{\"turn\":{turn},\"reason\":{{\"kind\":\"completed\"}}}}"),
            "",
            None,
            Flush::None,
        );
    }
}

/// A DSH-layout session of whole turns and at least `events` events (seeded, reproducible).
pub fn generate(seed: u64, events: u64) -> DshLayout {
    let mut builder = Builder::new(seed);
    let mut turn = 0;
    while builder.seq < events {
        turn += 1;
        builder.turn(turn);
    }
    builder.flush();
    builder.out
}

#[cfg(test)]
mod tests;
