//! Spill blobs in the canonical export (format-spec/07 F-07-19): after a session's event
//! lines, one line per blob its events cite, so an export carries everything the session
//! needs; the import stores the blobs (durably) before the events that cite them.

use super::canonical::{import_canonical_with_progress, CanonicalError, CanonicalImport};
use crate::session::json::single_line_error;
use crate::spill::{locators_in, BlobHash, SpillStore};
use crate::storage::coding::widen;
use crate::store::Store;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::Write;

use crate::limits::EVENTS_PER_READ;

/// The blobs cited by session `id`, in hash order.
pub fn cited_blobs(store: &Store, id: &str) -> crate::Result<BTreeSet<BlobHash>> {
    let total = store.session(id)?.events;
    let mut cited = BTreeSet::new();
    let mut from = 0;
    while from < total {
        let to = total.min(from + EVENTS_PER_READ);
        for event in store.read(id, from, to)? {
            cited.extend(locators_in(&event.data));
            cited.extend(locators_in(&event.envelope));
        }
        from = to;
    }
    Ok(cited)
}

/// Writes `{"spill":"<hash>","text":".."}` (UTF-8 payloads) or `{"spill":"<hash>","hex":".."}`
/// for every blob session `id` cites; returns how many. A cited blob that is missing or
/// damaged fails the export.
pub fn write_spill_lines(
    store: &Store,
    id: &str,
    out: &mut dyn Write,
) -> Result<u64, CanonicalError> {
    let spill = SpillStore::new_read_only(store.storage());
    let mut written = 0;
    for hash in cited_blobs(store, id)? {
        let payload = spill.get(&hash)?;
        let line = match String::from_utf8(payload) {
            Ok(text) => json!({"spill": hash.to_hex(), "text": text}),
            Err(error) => {
                let hex: String = error
                    .as_bytes()
                    .iter()
                    .map(|byte| format!("{byte:02x}"))
                    .collect();
                json!({"spill": hash.to_hex(), "hex": hex})
            }
        };
        out.write_all(line.to_string().as_bytes())?;
        out.write_all(b"\n")?;
        written += 1;
    }
    Ok(written)
}

fn malformed(line: usize, reason: impl Into<String>) -> CanonicalError {
    CanonicalError::Malformed {
        line,
        reason: reason.into(),
    }
}

/// The byte length of the header line and the `events` lines it announces.
fn canonical_length(bytes: &[u8]) -> Result<(usize, usize), CanonicalError> {
    let first_end = bytes
        .iter()
        .position(|&byte| byte == b'\n')
        .unwrap_or(bytes.len());
    let header: Value = serde_json::from_slice(&bytes[..first_end])
        .map_err(|error| malformed(1, single_line_error(&error)))?;
    let events = header
        .get("events")
        .and_then(Value::as_u64)
        .ok_or_else(|| malformed(1, "no event count"))?;
    let mut end = 0;
    // Each line takes at least its `\n`, so the count fits `usize`; a hostile count runs out
    // of bytes first (saturating: `events + 1` must not overflow).
    let mut lines = 0_usize;
    while widen(lines) < events.saturating_add(1) {
        let Some(newline) = bytes[end..].iter().position(|&byte| byte == b'\n') else {
            return Ok((bytes.len(), 0));
        };
        end += newline + 1;
        lines += 1;
    }
    Ok((end, lines))
}

/// Decodes one spill line (1-based `line` for errors) and checks its hash.
fn decode_spill_line(text: &str, line: usize) -> Result<(BlobHash, Vec<u8>), CanonicalError> {
    let value: Value =
        serde_json::from_str(text).map_err(|error| malformed(line, single_line_error(&error)))?;
    let hash = value
        .get("spill")
        .and_then(Value::as_str)
        .and_then(BlobHash::parse)
        .ok_or_else(|| malformed(line, "not a spill line"))?;
    let payload = match (value.get("text"), value.get("hex")) {
        (Some(Value::String(text)), None) => text.clone().into_bytes(),
        (None, Some(Value::String(hex))) if hex.len() % 2 == 0 => (0..hex.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&hex[at..at + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| malformed(line, "bad hex payload"))?,
        _ => return Err(malformed(line, "spill line needs one of text or hex")),
    };
    if BlobHash::of(&payload) != hash {
        return Err(malformed(line, "spill payload does not match its hash"));
    }
    Ok((hash, payload))
}

/// Refuses a file whose events cite a spill blob that neither its spill lines nor the store
/// hold: imported, the session would hold dangling locators and fail its own export.
fn check_cited_blobs(
    canonical: &[u8],
    blobs: &[(BlobHash, Vec<u8>)],
    spill: &SpillStore,
) -> Result<(), CanonicalError> {
    let brought: BTreeSet<BlobHash> = blobs.iter().map(|(hash, _)| *hash).collect();
    let text = String::from_utf8_lossy(canonical);
    // Line 1 is the header; events follow from line 2.
    for (index, line) in text.lines().enumerate().skip(1) {
        for hash in locators_in(line) {
            if !brought.contains(&hash) && spill.verify(&hash).is_err() {
                return Err(malformed(
                    index + 1,
                    format!(
                        "the event cites spill blob {}, which neither the file's spill lines \
                         nor the store hold",
                        hash.locator()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Imports a canonical file that may end with spill lines: the blobs are checked and stored
/// first (each durable before any event cites it), then the events are imported.
pub fn import_canonical_with_spill(
    store: &Store,
    bytes: &[u8],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<CanonicalImport, CanonicalError> {
    let (canonical_end, canonical_lines) = canonical_length(bytes)?;
    let rest = std::str::from_utf8(&bytes[canonical_end..])
        .map_err(|_| malformed(canonical_lines + 1, "invalid UTF-8"))?;
    let mut blobs = Vec::new();
    for (index, text) in rest.lines().enumerate() {
        blobs.push(decode_spill_line(text, canonical_lines + index + 1)?);
    }
    let spill = SpillStore::new(store.storage());
    check_cited_blobs(&bytes[..canonical_end], &blobs, &spill)?;
    let mut created = Vec::new();
    for (hash, payload) in &blobs {
        if spill.verify(hash).is_err() {
            created.push(*hash);
        }
        spill.put(payload)?;
    }
    let imported = import_canonical_with_progress(store, &bytes[..canonical_end], progress);
    if imported.is_err() {
        // A refused import changes nothing: drop the blobs it brought (none is cited).
        spill.remove_uncited(&created);
    }
    imported
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostile_event_count_runs_out_of_lines_instead_of_overflowing() {
        let bytes = b"{\"events\":18446744073709551615}\n{\"a\":1}\n";
        let length = canonical_length(bytes).map_err(|error| error.to_string());
        assert_eq!(
            length,
            Ok((bytes.len(), 0)),
            "every line is the canonical part's"
        );
    }
}
