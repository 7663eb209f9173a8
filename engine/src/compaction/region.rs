//! Region checks over the current surface: tool-pairing balance and `validateSurfaceRegion` (§5.6), `selectCompactableRange` (§5.7).

use super::{compaction_error, CompactionErrorCode};
use crate::derive::projection::session_event;
use crate::error::Result;
use crate::session::relational::node_delta;
use crate::store::Store;

/// Tool-pairing deltas of the surface nodes (§5.6): an assistant message adds its tool-call
/// blocks, a tool result subtracts one, anything else adds nothing.
pub fn pairing_deltas(store: &Store, session: &str, nodes: &[u64]) -> Result<Vec<i64>> {
    let mut deltas = Vec::with_capacity(nodes.len());
    for &seq in nodes {
        let event = session_event(session, &store.get(session, seq)?)?;
        let delta = node_delta(&event);
        deltas.push(delta);
    }
    Ok(deltas)
}

/// Whether the cut before each position (and after the last) is balanced; an error when a
/// running total goes negative (a result with no call: corrupt surface).
fn balanced_cuts(nodes: &[u64], deltas: &[i64]) -> Result<Vec<bool>> {
    let mut cuts = Vec::with_capacity(nodes.len() + 1);
    cuts.push(true);
    let mut total = 0_i64;
    for (seq, delta) in nodes.iter().zip(deltas) {
        total += delta;
        if total < 0 {
            return Err(compaction_error(
                CompactionErrorCode::Region,
                format!("tool-pairing balance: tool/result at surface seq {seq} has no matching tool-call (corrupt surface)"),
            ));
        }
        cuts.push(total == 0);
    }
    Ok(cuts)
}

/// DSH's `validateSurfaceRegion(start, end)`: returns the start and end positions.
pub fn validate_region(
    nodes: &[u64],
    deltas: &[i64],
    start: u64,
    end: u64,
) -> Result<(usize, usize)> {
    let region = |message: String| compaction_error(CompactionErrorCode::Region, message);
    let position = |seq: u64| nodes.iter().position(|node| *node == seq);
    let first = position(start).ok_or_else(|| {
        region(format!(
            "compactRegion: start seq {start} not found in surface"
        ))
    })?;
    let last = position(end)
        .ok_or_else(|| region(format!("compactRegion: end seq {end} not found in surface")))?;
    if first > last {
        return Err(region(format!("compactRegion: start seq {start} (position {first}) is after end seq {end} (position {last}) on the surface")));
    }
    let cuts = balanced_cuts(nodes, deltas)?;
    if !cuts[first] {
        return Err(region(format!("compactRegion: start seq {start} is not a balanced boundary (would split a step's tool-call/result pair)")));
    }
    if !cuts[last + 1] {
        return Err(region(format!("compactRegion: end seq {end} is not a balanced boundary (would split a step, or the step is still open)")));
    }
    Ok((first, last))
}

/// DSH's `selectCompactableRange` (§5.7): the head-anchored span to compact so that about
/// `retain_tokens` of the newest surface stays, never splitting a tool-call/result pair.
/// `prices` is the token meter's `(seq, tokens)` per node; `None`: nothing to compact.
pub fn select_compactable_range(
    nodes: &[u64],
    prices: &[(u64, u64)],
    deltas: &[i64],
    retain_tokens: u64,
) -> Result<Option<(u64, u64)>> {
    if prices.is_empty() {
        return Ok(None);
    }
    let measured: Vec<u64> = prices.iter().map(|(seq, _)| *seq).collect();
    if measured != nodes {
        return Err(compaction_error(
            CompactionErrorCode::Changed,
            "compaction: token-meter surface does not match the current session surface",
        ));
    }
    let mut sum = 0_u64;
    let mut keep = 0;
    for position in (0..prices.len()).rev() {
        sum += prices[position].1;
        if sum >= retain_tokens {
            keep = position;
            break;
        }
    }
    let cuts = balanced_cuts(nodes, deltas)?;
    while keep > 0 && !cuts[keep] {
        keep -= 1;
    }
    if keep == 0 {
        return Ok(None);
    }
    Ok(Some((nodes[0], nodes[keep - 1])))
}
