//! `run_sweep STORE`: re-compresses the event blocks of a sealed store's run files (as left by
//! `runs --keep`) under other block sizes, zstd levels and layouts, to choose the run
//! format's parameters (format-spec/06-runs-and-index.md, F-06-3). Reads the runs' frames back
//! with the engine's decoder, re-cuts each session's raw stream at frame boundaries with the
//! writer's greedy rule, and reports stored bytes per event and compression speed.
//!
//! Layouts: `rows` is today's (frames back to back); `columns` puts the 41 fixed bytes of
//! every event frame (frame header and fixed payload fields) first, then every frame's data
//! and envelope. Prints a plain report; nothing is asserted.

use anyhow::{Context, Result};
use dshdb::storage::frame::{Record, EVENT_FIXED_BYTES, FRAME_HEADER_BYTES};
use dshdb::storage::manifest::RunEntry;
use dshdb::storage::run::{
    decode_block, walk_block, BlockItem, RunIndex, DEFINITIONS_SESSION, FOOTER_ENTRY_BYTES,
};
use std::path::PathBuf;
use std::time::Instant;
use zstd::zstd_safe::CParameter;

/// Bytes of an event frame before its data: frame header and the fixed payload fields.
const EVENT_HEAD_BYTES: usize = FRAME_HEADER_BYTES + EVENT_FIXED_BYTES;

/// One session's frames from one run, back to back, with every frame's size.
struct Stream {
    raw: Vec<u8>,
    frames: Vec<usize>,
}

fn load_streams(store: &std::path::Path) -> Result<(Vec<Stream>, u64, u64)> {
    let mut streams = Vec::new();
    let mut events = 0u64;
    let mut event_block_bytes = 0u64;
    let mut paths: Vec<PathBuf> = std::fs::read_dir(store.join("runs"))?
        .flatten()
        .map(|entry| entry.path())
        .collect();
    paths.sort();
    for path in paths {
        let bytes = std::fs::read(&path)?;
        let name = path.file_stem().and_then(|s| s.to_str()).context("name")?;
        let entry = RunEntry {
            id: u64::from_str_radix(name, 16)?,
            salt: u64::from_le_bytes(bytes[24..32].try_into()?),
            file_bytes: bytes.len() as u64,
        };
        let index = RunIndex::decode(&bytes[..64], &bytes, 0, &entry)?;
        let mut current: Option<(u32, Stream)> = None;
        for block in &index.blocks {
            if block.session == DEFINITIONS_SESSION {
                continue;
            }
            event_block_bytes += u64::from(block.stored_bytes) + FOOTER_ENTRY_BYTES as u64;
            let stored = &bytes[block.file_offset as usize..][..block.stored_bytes as usize];
            let raw = decode_block(stored, block, entry.id)?;
            if current.as_ref().map(|(session, _)| *session) != Some(block.session) {
                if let Some((_, stream)) = current.take() {
                    streams.push(stream);
                }
                current = Some((
                    block.session,
                    Stream {
                        raw: Vec::new(),
                        frames: Vec::new(),
                    },
                ));
            }
            let (_, stream) = current.as_mut().context("stream")?;
            walk_block(&raw, block, &index, |_, frame_bytes, item| {
                let holds = match item {
                    BlockItem::Record(Record::Event(_)) => 1,
                    BlockItem::Row(row) => u64::from(row.member_count),
                    BlockItem::Record(_) => 0,
                };
                if holds > 0 {
                    stream.frames.push(frame_bytes as usize);
                    events += holds;
                }
                Ok(())
            })?;
            stream.raw.extend_from_slice(&raw);
        }
        if let Some((_, stream)) = current.take() {
            streams.push(stream);
        }
    }
    Ok((streams, events, event_block_bytes))
}

#[derive(Clone, Copy)]
struct Config {
    block_bytes: usize,
    level: i32,
    long: bool,
    columns: bool,
}

/// Frames of one block in column layout: all fixed heads, then all data and envelopes.
fn columns(raw: &[u8], frames: &[usize]) -> Vec<u8> {
    let mut heads = Vec::with_capacity(frames.len() * EVENT_HEAD_BYTES);
    let mut bodies = Vec::with_capacity(raw.len());
    let mut at = 0;
    for &size in frames {
        let head = size.min(EVENT_HEAD_BYTES);
        heads.extend_from_slice(&raw[at..at + head]);
        bodies.extend_from_slice(&raw[at + head..at + size]);
        at += size;
    }
    heads.extend_from_slice(&bodies);
    heads
}

fn sweep(streams: &[Stream], config: Config) -> Result<(u64, u64, f64)> {
    let mut compressor = zstd::bulk::Compressor::new(config.level)?;
    compressor.include_checksum(true)?;
    if config.long {
        compressor.set_parameter(CParameter::EnableLongDistanceMatching(true))?;
    }
    let (mut stored, mut blocks, mut raw_total) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    for stream in streams {
        let (mut first, mut start) = (0usize, 0usize);
        while first < stream.frames.len() {
            let (mut last, mut end) = (first + 1, start + stream.frames[first]);
            while last < stream.frames.len()
                && end + stream.frames[last] - start <= config.block_bytes
            {
                end += stream.frames[last];
                last += 1;
            }
            let raw = &stream.raw[start..end];
            let out = if config.columns {
                compressor.compress(&columns(raw, &stream.frames[first..last]))?
            } else {
                compressor.compress(raw)?
            };
            stored += out.len() as u64 + FOOTER_ENTRY_BYTES as u64;
            blocks += 1;
            raw_total += raw.len() as u64;
            (first, start) = (last, end);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok((stored, blocks, raw_total as f64 / 1e6 / seconds))
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let store = PathBuf::from(args.next().context("usage: run_sweep STORE [LEVELS]")?);
    let levels: Vec<i32> = match args.next() {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![9, 12, 15, 17, 19],
    };
    let (streams, events, current) = load_streams(&store)?;
    println!(
        "{events} events; event blocks now {:.2} B/event (stored + footer entry)",
        current as f64 / events as f64
    );
    println!("| block KiB | level | ldm | layout | B/event | blocks | MB/s |");
    println!("|---:|---:|---|---|---:|---:|---:|");
    let mut configs = Vec::new();
    for block_kib in [256usize, 512, 1024] {
        for &level in &levels {
            for columns in [false, true] {
                configs.push(Config {
                    block_bytes: block_kib * 1024,
                    level,
                    long: false,
                    columns,
                });
            }
        }
    }
    configs.push(Config {
        block_bytes: 1024 * 1024,
        level: levels[0],
        long: true,
        columns: false,
    });
    for config in configs {
        let (stored, blocks, speed) = sweep(&streams, config)?;
        println!(
            "| {} | {} | {} | {} | {:.2} | {blocks} | {speed:.1} |",
            config.block_bytes / 1024,
            config.level,
            config.long,
            if config.columns { "columns" } else { "rows" },
            stored as f64 / events as f64
        );
    }
    Ok(())
}
