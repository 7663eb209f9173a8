//! Durability modes (FLEET.md §5.3, format-spec F-09-30..F-09-35): `replicated` acks after
//! the local fsync and the JetStream ack; `local` acks after the local fsync and ships the
//! batch to the tail in the background; `sealed` acks after the local fsync and lets only
//! sealed runs leave the node. With `degrade_to_local_after`, a `replicated` node whose
//! publishes stall acks in `local` mode for the stalled tail stream, records the at-risk
//! window, and returns to `replicated` once the backlog is shipped in order.
//!
//! Every batch acknowledged without the tail ack waits in the node's **backlog** (per
//! session, in seq order) until it is shipped (the tail acknowledged it), sealed (a run in
//! the cold store holds it), or lost (a newer epoch fenced the shard: nothing of it can be
//! written any more). The backlog is the replication lag, and what it holds when the node
//! dies is the RPO. A backlog entry once sent is sent again only as the very same message
//! (same msg id, same payload), so the dedup window keeps it exactly once; the entries of
//! one session go out one message at a time, in order, so the tail never holds a later batch
//! of a session without the earlier ones.

use crate::backend::{ColdStore, Coordinator, Fence, TailLog, TailPublish};
use crate::error::{BackendError, FleetError, FleetResult};
use crate::node::{bump, Node, OwnedShard, SessionSlot, MAX_TAIL_PAYLOAD_BYTES};
use crate::shard::{epoch_subject, session_subject, stream_index};
use crate::wire::TailBatch;
use std::collections::{HashMap, VecDeque};
use std::str::FromStr;
use std::sync::atomic::AtomicU64;

/// Closed at-risk windows a node keeps for its report (older ones are dropped; their count
/// stays in the metrics).
pub const MAX_AT_RISK_WINDOWS: usize = 256;
/// Lost unshipped ranges a node keeps for its report (older ones are dropped; their events
/// stay counted in `unshipped_events_lost`).
pub const MAX_LOST_RANGES: usize = 4096;
/// Messages an append sends from its session's backlog, ahead of its own batch, before it
/// acks in `local` mode instead (bounds one append's work after a long stall).
pub const MAX_DRAIN_MESSAGES: usize = 64;
/// Default of `NodeConfig::stalled_probe_timeout_ms`: how long a replicator round waits for
/// the one probe message it sends on a stalled stream, in ms. The round holds the probed
/// session's slot meanwhile, so this bounds how long an append of that session waits
/// behind it (the publish retries alone take seconds).
pub const DEFAULT_STALLED_PROBE_TIMEOUT_MS: u64 = 500;
/// Default of `NodeConfig::ship_wait_timeout_ms`: how long a replicator round waits for a
/// message on a stream not known to be stalled, in ms. The round holds the session's slot
/// meanwhile, so when the tail goes away this bounds how long a `local`-mode append waits
/// behind the background shipping (the publish retries alone take seconds); a message not
/// answered by then marks its stream stalled, and later rounds only probe it.
pub const DEFAULT_SHIP_WAIT_TIMEOUT_MS: u64 = 2_000;

/// When an append is acknowledged, per node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DurabilityMode {
    /// Local fdatasync and the JetStream quorum ack: RPO 0.
    #[default]
    Replicated,
    /// Local fdatasync; the tail is shipped in the background: RPO = the replication lag.
    Local,
    /// Local fdatasync; only sealed runs leave the node: RPO = the unsealed tail.
    Sealed,
}

impl DurabilityMode {
    pub fn name(self) -> &'static str {
        match self {
            DurabilityMode::Replicated => "replicated",
            DurabilityMode::Local => "local",
            DurabilityMode::Sealed => "sealed",
        }
    }
}

impl FromStr for DurabilityMode {
    type Err = FleetError;

    fn from_str(text: &str) -> FleetResult<DurabilityMode> {
        match text {
            "replicated" => Ok(DurabilityMode::Replicated),
            "local" => Ok(DurabilityMode::Local),
            "sealed" => Ok(DurabilityMode::Sealed),
            other => Err(FleetError::InvalidInput {
                reason: format!("durability mode {other:?}: replicated, local or sealed"),
            }),
        }
    }
}

/// Acknowledged events of one session not yet off the node (the exact at-risk range).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnshippedRange {
    pub session: String,
    pub shard: u32,
    pub epoch: u64,
    pub first_seq: u64,
    pub end_seq: u64,
    /// Clock time (ms) the oldest of them was acknowledged.
    pub acked_at_ms: u64,
}

/// The replication lag: acknowledged events only this node holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicationLag {
    pub events: u64,
    /// Encoded tail-message bytes of those events.
    pub bytes: u64,
    /// Age of the oldest of them, in ms (0 when there is none).
    pub oldest_age_ms: u64,
    pub sessions: u64,
}

/// A time span in which a `replicated` node acknowledged in `local` mode on one tail stream
/// because its publishes stalled. `to_ms` is set once the backlog of the stream is shipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtRiskWindow {
    pub stream: u32,
    pub from_ms: u64,
    pub to_ms: Option<u64>,
    /// Events acknowledged in `local` mode during the window.
    pub events: u64,
}

/// What one round of the background replicator did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShipRound {
    pub messages: u64,
    pub events: u64,
    /// Sessions whose message got no definitive answer (they stay in the backlog).
    pub stalled: u64,
    /// Sessions whose backlog was lost to a fence.
    pub lost: u64,
    /// Sessions skipped because an append, read or seal held them.
    pub busy: u64,
}

/// Counters of the modes (FLEET.md metrics: replication).
#[derive(Debug, Default)]
pub struct ModeMetrics {
    /// Appends acknowledged without the tail ack (`local`, `sealed`, degraded).
    pub local_acks: AtomicU64,
    pub local_acked_events: AtomicU64,
    /// Events acknowledged in `local` mode by a degraded `replicated` node.
    pub degraded_events: AtomicU64,
    /// At-risk windows opened.
    pub degrades: AtomicU64,
    /// Backlog messages and events the tail acknowledged.
    pub shipped_messages: AtomicU64,
    pub shipped_events: AtomicU64,
    /// Backlog events left behind by a fence (a newer owner rebuilt without them).
    pub unshipped_events_lost: AtomicU64,
    /// Backlog events dropped because a sealed run holds them.
    pub unshipped_events_sealed: AtomicU64,
}

/// One acknowledged batch waiting in the backlog.
#[derive(Debug)]
struct ShipEntry {
    owned: OwnedShard,
    batch: TailBatch,
    bytes: usize,
    acked_at_ms: u64,
    /// Events of it not acknowledged (a degradable append's own batch, shipped inline
    /// before its ack, stays here when the append fails): not counted in the lag.
    unacked: u64,
    /// The message once sent: every later attempt sends exactly this (dedup by msg id).
    sent: Option<TailPublish>,
}

#[derive(Debug)]
struct SessionBacklog {
    shard: u32,
    entries: VecDeque<ShipEntry>,
}

/// Stall state of one tail stream.
#[derive(Debug, Default)]
struct StreamHealth {
    /// The last publish of the stream got no definitive answer.
    stalled: bool,
    window: Option<AtRiskWindow>,
}

/// The node's backlog, stream health and report lists.
#[derive(Debug, Default)]
pub(crate) struct Replication {
    backlog: HashMap<String, SessionBacklog>,
    streams: HashMap<u32, StreamHealth>,
    closed_windows: VecDeque<AtRiskWindow>,
    lost: VecDeque<UnshippedRange>,
}

impl Replication {
    fn stream_backlog_empty(&self, stream: u32) -> bool {
        !self
            .backlog
            .values()
            .any(|backlog| stream_index(backlog.shard) == stream)
    }

    fn record_lost(&mut self, range: UnshippedRange) {
        if self.lost.len() >= MAX_LOST_RANGES {
            self.lost.pop_front();
        }
        self.lost.push_back(range);
    }

    /// Drops the entries of `session` that `keep` refuses, recording them as lost; returns
    /// the events dropped.
    fn drop_entries(&mut self, session: &str, keep: impl Fn(&ShipEntry) -> bool) -> u64 {
        let Some(backlog) = self.backlog.get_mut(session) else {
            return 0;
        };
        let shard = backlog.shard;
        let (kept, dropped): (VecDeque<ShipEntry>, VecDeque<ShipEntry>) =
            std::mem::take(&mut backlog.entries)
                .into_iter()
                .partition(|entry| keep(entry));
        backlog.entries = kept;
        if backlog.entries.is_empty() {
            self.backlog.remove(session);
        }
        let mut events = 0;
        for entry in dropped {
            events += entry.batch.events.len() as u64;
            self.record_lost(UnshippedRange {
                session: session.to_string(),
                shard,
                epoch: entry.owned.epoch,
                first_seq: entry.batch.first_seq(),
                end_seq: entry.batch.end_seq(),
                acked_at_ms: entry.acked_at_ms,
            });
        }
        events
    }
}

/// How an append is acknowledged, decided before its local write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// The tail ack first (no degrade policy).
    Replicated,
    /// Through the session's backlog, shipped inline; on a stall, acked in `local` mode.
    Degradable { after_ms: u64 },
    /// Acked after the local fsync, into the backlog (`local`, or a stalled stream).
    Local,
    /// Acked after the local fsync, into the backlog that only a seal clears.
    Sealed,
}

/// What shipping a session's front message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shipped {
    /// The backlog of the session is empty.
    Empty,
    /// One message acknowledged; `duplicate`: the tail had it already (a retry of a
    /// message stored before).
    One { events: u64, duplicate: bool },
    /// No definitive answer; the message stays first in the backlog.
    Stalled,
    /// Fenced: the shard is lost and so is the session's backlog of that epoch.
    Lost,
}

/// The fenced tail message carrying `batch`, whose encoding is `payload` (F-09-20).
pub(crate) fn tail_message(
    shard: u32,
    owned: OwnedShard,
    batch: &TailBatch,
    payload: Vec<u8>,
) -> TailPublish {
    let first_seq = batch.first_seq();
    TailPublish {
        subject: session_subject(&batch.session, shard),
        payload: payload.into(),
        msg_id: format!("{}/{first_seq}/e{}", batch.session, owned.epoch),
        fence: Some(Fence {
            subject: epoch_subject(shard),
            last_seq: owned.fence_seq,
        }),
        headers: vec![
            ("Dsh-Epoch".to_string(), owned.epoch.to_string()),
            ("Dsh-First-Seq".to_string(), first_seq.to_string()),
            (
                "Dsh-Last-Seq".to_string(),
                batch.end_seq().saturating_sub(1).to_string(),
            ),
        ],
    }
}

impl<T: TailLog, C: Coordinator, S: ColdStore> Node<T, C, S> {
    /// How the next append of a session of `shard` is acknowledged.
    pub(crate) fn route(&self, shard: u32) -> Route {
        match self.config().mode {
            DurabilityMode::Local => Route::Local,
            DurabilityMode::Sealed => Route::Sealed,
            DurabilityMode::Replicated => match self.config().degrade_to_local_after_ms {
                None => Route::Replicated,
                Some(after_ms) => {
                    let replication = self.replication.lock();
                    let stalled = replication
                        .streams
                        .get(&stream_index(shard))
                        .is_some_and(|health| health.stalled);
                    if stalled {
                        Route::Local
                    } else {
                        Route::Degradable { after_ms }
                    }
                }
            },
        }
    }

    /// Queues a batch behind the session's backlog: acknowledged, or (`acked` false) about
    /// to be, once [`Node::mark_acked`] says so.
    pub(crate) fn push_backlog(
        &self,
        shard: u32,
        owned: OwnedShard,
        batch: TailBatch,
        acked: bool,
    ) {
        let bytes = batch.encode().len();
        let entry = ShipEntry {
            owned,
            bytes,
            acked_at_ms: self.clock_ms(),
            unacked: if acked { 0 } else { batch.events.len() as u64 },
            batch,
            sent: None,
        };
        let mut replication = self.replication.lock();
        replication
            .backlog
            .entry(entry.batch.session.clone())
            .or_insert_with(|| SessionBacklog {
                shard,
                entries: VecDeque::new(),
            })
            .entries
            .push_back(entry);
    }

    /// The events `first_seq..end_seq` of the session's backlog are acknowledged now.
    pub(crate) fn mark_acked(&self, session: &str, first_seq: u64, end_seq: u64) {
        let now_ms = self.clock_ms();
        let mut replication = self.replication.lock();
        let Some(backlog) = replication.backlog.get_mut(session) else {
            return;
        };
        for entry in &mut backlog.entries {
            let covers = entry.batch.first_seq() <= first_seq && end_seq <= entry.batch.end_seq();
            if covers {
                entry.unacked = entry.unacked.saturating_sub(end_seq - first_seq);
                entry.acked_at_ms = entry.acked_at_ms.min(now_ms);
                return;
            }
        }
    }

    /// Counts a local acknowledgement; on a degraded stream, in its at-risk window.
    pub(crate) fn count_local_ack(&self, shard: u32, events: u64) {
        bump(&self.mode_metrics.local_acks, 1);
        bump(&self.mode_metrics.local_acked_events, events);
        if self.config().mode != DurabilityMode::Replicated {
            return;
        }
        bump(&self.mode_metrics.degraded_events, events);
        let now_ms = self.clock_ms();
        let mut replication = self.replication.lock();
        let health = replication.streams.entry(stream_index(shard)).or_default();
        let window = health.window.get_or_insert_with(|| {
            bump(&self.mode_metrics.degrades, 1);
            AtRiskWindow {
                stream: stream_index(shard),
                from_ms: now_ms,
                to_ms: None,
                events: 0,
            }
        });
        window.events += events;
    }

    /// A publish on `stream` got no definitive answer.
    pub(crate) fn note_stalled(&self, stream: u32) {
        self.replication
            .lock()
            .streams
            .entry(stream)
            .or_default()
            .stalled = true;
    }

    /// A publish on `stream` was acknowledged: the stall is over; the at-risk window closes
    /// once the stream's backlog is shipped.
    fn note_shipped(&self, stream: u32) {
        let now_ms = self.clock_ms();
        let mut replication = self.replication.lock();
        let empty = replication.stream_backlog_empty(stream);
        let Some(health) = replication.streams.get_mut(&stream) else {
            return;
        };
        health.stalled = false;
        if !empty {
            return;
        }
        if let Some(mut window) = health.window.take() {
            window.to_ms = Some(now_ms);
            if replication.closed_windows.len() >= MAX_AT_RISK_WINDOWS {
                replication.closed_windows.pop_front();
            }
            replication.closed_windows.push_back(window);
        }
    }

    /// Whether the session has acknowledged events of `epoch` only this node holds (a
    /// rebuild from the replicated history would drop them).
    pub(crate) fn holds_unreplicated(&self, session: &str) -> bool {
        self.replication.lock().backlog.contains_key(session)
    }

    /// Drops the session's backlog written under epochs older than `epoch`: a newer epoch's
    /// marker fences it, so it can never be shipped (lost; the RPO of that takeover).
    pub(crate) fn drop_stale_backlog(&self, session: &str, epoch: u64) {
        let events = self
            .replication
            .lock()
            .drop_entries(session, |entry| entry.owned.epoch >= epoch);
        bump(&self.mode_metrics.unshipped_events_lost, events);
    }

    /// Drops the backlog of `shard` written under `epoch` or older (the shard is lost).
    pub(crate) fn drop_shard_backlog(&self, shard: u32, epoch: u64) {
        let mut replication = self.replication.lock();
        let sessions: Vec<String> = replication
            .backlog
            .iter()
            .filter(|(_, backlog)| backlog.shard == shard)
            .map(|(session, _)| session.clone())
            .collect();
        let mut events = 0;
        for session in sessions {
            events += replication.drop_entries(&session, |entry| entry.owned.epoch > epoch);
        }
        drop(replication);
        bump(&self.mode_metrics.unshipped_events_lost, events);
    }

    /// Drops the backlog entries a sealed run now holds (all events below `sealed_end`).
    pub(crate) fn drop_sealed_backlog(&self, session: &str, sealed_end: u64) {
        let mut replication = self.replication.lock();
        let Some(backlog) = replication.backlog.get_mut(session) else {
            return;
        };
        let mut events = 0;
        while backlog
            .entries
            .front()
            .is_some_and(|entry| entry.batch.end_seq() <= sealed_end)
        {
            if let Some(entry) = backlog.entries.pop_front() {
                events += entry.batch.events.len() as u64;
            }
        }
        let shard = backlog.shard;
        if backlog.entries.is_empty() {
            replication.backlog.remove(session);
        }
        drop(replication);
        bump(&self.mode_metrics.unshipped_events_sealed, events);
        self.note_backlog_change(shard);
    }

    /// Closes the stream's at-risk window if its stall is over and its backlog is gone.
    fn note_backlog_change(&self, shard: u32) {
        let stream = stream_index(shard);
        let stalled = self
            .replication
            .lock()
            .streams
            .get(&stream)
            .is_some_and(|health| health.stalled);
        if !stalled {
            self.note_shipped(stream);
        }
    }

    /// The session's next message to send: the first entry's message if it was sent
    /// before, else the entries not yet sent merged into one batch (same epoch, within
    /// [`MAX_TAIL_PAYLOAD_BYTES`]), which from then on is that message.
    fn front_message(&self, session: &str) -> Option<(u32, OwnedShard, TailBatch, TailPublish)> {
        let mut replication = self.replication.lock();
        let backlog = replication.backlog.get_mut(session)?;
        let shard = backlog.shard;
        let front = backlog.entries.front()?;
        if let Some(sent) = &front.sent {
            return Some((shard, front.owned, front.batch.clone(), sent.clone()));
        }
        let owned = front.owned;
        let mut merged = backlog.entries.pop_front()?;
        while let Some(next) = backlog.entries.front() {
            let fits = next.sent.is_none()
                && next.owned == owned
                && merged.bytes + next.bytes <= MAX_TAIL_PAYLOAD_BYTES;
            if !fits {
                break;
            }
            let Some(next) = backlog.entries.pop_front() else {
                break;
            };
            merged.bytes += next.bytes;
            merged.unacked += next.unacked;
            merged.acked_at_ms = merged.acked_at_ms.min(next.acked_at_ms);
            merged.batch.events.extend(next.batch.events);
        }
        let message = tail_message(shard, owned, &merged.batch, merged.batch.encode());
        merged.bytes = message.payload.len();
        merged.sent = Some(message.clone());
        let batch = merged.batch.clone();
        backlog.entries.push_front(merged);
        Some((shard, owned, batch, message))
    }

    /// Removes the session's first entry once the tail acknowledged it.
    fn pop_shipped(&self, session: &str) {
        let mut replication = self.replication.lock();
        let Some(backlog) = replication.backlog.get_mut(session) else {
            return;
        };
        backlog.entries.pop_front();
        if backlog.entries.is_empty() {
            replication.backlog.remove(session);
        }
    }

    /// Sends the session's first backlog message and settles its outcome. The caller holds
    /// the session's slot, so no other task sends the session's backlog meanwhile.
    pub(crate) async fn ship_front(&self, session: &str, slot: &mut SessionSlot) -> Shipped {
        let Some((shard, owned, batch, message)) = self.front_message(session) else {
            return Shipped::Empty;
        };
        let outcome = self.publish_grouped(shard, owned, message).await;
        let checked = match outcome {
            Ok(ack) if ack.duplicate => match self.duplicate_carries(shard, &batch, ack).await {
                Ok(true) => Ok(ack),
                // The tail holds another batch under this msg id: the backlog no longer
                // continues the replicated history, so it is treated as fenced.
                Ok(false) => Err(BackendError::Fenced {
                    subject: epoch_subject(shard),
                    expected: owned.fence_seq,
                }),
                Err(error) => Err(error),
            },
            other => other,
        };
        match checked {
            Ok(ack) => {
                self.pop_shipped(session);
                let events = batch.events.len() as u64;
                slot.last_stream_seq = slot.last_stream_seq.max(ack.stream_seq);
                slot.replicated_end = slot.replicated_end.max(batch.end_seq());
                bump(&self.mode_metrics.shipped_messages, 1);
                bump(&self.mode_metrics.shipped_events, events);
                self.note_shipped(stream_index(shard));
                Shipped::One {
                    events,
                    duplicate: ack.duplicate,
                }
            }
            Err(BackendError::Fenced { .. }) => {
                bump(&self.metrics.fenced_writes, 1);
                self.drop_shard_backlog(shard, owned.epoch);
                self.lose_shard(shard, owned.epoch);
                slot.validated_epoch = 0;
                Shipped::Lost
            }
            Err(_) => {
                self.note_stalled(stream_index(shard));
                Shipped::Stalled
            }
        }
    }

    /// Ships the session's backlog in order, up to [`MAX_DRAIN_MESSAGES`] messages; stops at
    /// the first message without a definitive answer. Drained: the last message shipped
    /// (`Empty` if there was none).
    pub(crate) async fn drain_session(&self, session: &str, slot: &mut SessionSlot) -> Shipped {
        let mut last = Shipped::Empty;
        for _ in 0..MAX_DRAIN_MESSAGES {
            match self.ship_front(session, slot).await {
                shipped @ Shipped::One { .. } => last = shipped,
                Shipped::Empty => return last,
                other => return other,
            }
        }
        if self.holds_unreplicated(session) {
            Shipped::Stalled
        } else {
            last
        }
    }

    /// The sessions a replicator round sends, with their tail stream and whether each is a
    /// stalled stream's probe: every session with backlog of a healthy stream, one per
    /// stalled stream.
    fn round_sessions(&self) -> Vec<(String, u32, bool)> {
        let replication = self.replication.lock();
        let mut probed = std::collections::HashSet::new();
        let mut sessions = Vec::new();
        for (session, backlog) in &replication.backlog {
            let stream = stream_index(backlog.shard);
            let stalled = replication
                .streams
                .get(&stream)
                .is_some_and(|health| health.stalled);
            if !stalled {
                sessions.push((session.clone(), stream, false));
            } else if probed.insert(stream) {
                sessions.push((session.clone(), stream, true));
            }
        }
        sessions
    }

    /// One round of the background replicator: sends the first backlog message of every
    /// session not busy, all at once (the stream queues group them), and settles each,
    /// waiting for each at most `ship_wait_timeout_ms` (then its stream counts as stalled).
    /// A stalled stream gets one probe, waited for at most `stalled_probe_timeout_ms`, so
    /// the round does not hold many sessions' slots through an election. Nothing leaves
    /// the node in `sealed` mode.
    pub async fn ship(&self) -> ShipRound {
        let mut round = ShipRound::default();
        if self.config().mode == DurabilityMode::Sealed {
            return round;
        }
        let mut held = Vec::new();
        for (session, stream, probe) in self.round_sessions() {
            match self.slot(&session).try_lock_owned() {
                Ok(guard) => held.push((session, stream, probe, guard)),
                Err(_) => round.busy += 1,
            }
        }
        let outcomes = futures::future::join_all(held.iter_mut().map(
            |(session, stream, probe, guard)| async move {
                let wait_ms = if *probe {
                    self.config().stalled_probe_timeout_ms
                } else {
                    self.config().ship_wait_timeout_ms
                };
                let wait = std::time::Duration::from_millis(wait_ms);
                match tokio::time::timeout(wait, self.ship_front(session, guard)).await {
                    Ok(shipped) => shipped,
                    Err(_) => {
                        self.note_stalled(*stream);
                        Shipped::Stalled
                    }
                }
            },
        ))
        .await;
        for outcome in outcomes {
            match outcome {
                Shipped::One { events, .. } => {
                    round.messages += 1;
                    round.events += events;
                }
                Shipped::Stalled => round.stalled += 1,
                Shipped::Lost => round.lost += 1,
                Shipped::Empty => {}
            }
        }
        round
    }

    /// The replication lag now: acknowledged events only this node holds.
    pub fn replication_lag(&self) -> ReplicationLag {
        let now_ms = self.clock_ms();
        let replication = self.replication.lock();
        let mut lag = ReplicationLag::default();
        let mut oldest = None::<u64>;
        for backlog in replication.backlog.values() {
            lag.sessions += 1;
            for entry in &backlog.entries {
                lag.events += (entry.batch.events.len() as u64).saturating_sub(entry.unacked);
                lag.bytes += entry.bytes as u64;
                oldest = Some(oldest.map_or(entry.acked_at_ms, |at| at.min(entry.acked_at_ms)));
            }
        }
        lag.oldest_age_ms = oldest.map_or(0, |at| now_ms.saturating_sub(at));
        lag
    }

    /// The exact at-risk ranges now: per session, the acknowledged seqs only this node
    /// holds (what a crash now would lose).
    pub fn unshipped(&self) -> Vec<UnshippedRange> {
        let replication = self.replication.lock();
        let mut ranges: Vec<UnshippedRange> = replication
            .backlog
            .iter()
            .filter_map(|(session, backlog)| {
                let first = backlog.entries.front()?;
                let last = backlog.entries.back()?;
                Some(UnshippedRange {
                    session: session.clone(),
                    shard: backlog.shard,
                    epoch: first.owned.epoch,
                    first_seq: first.batch.first_seq(),
                    end_seq: last.batch.end_seq(),
                    acked_at_ms: backlog
                        .entries
                        .iter()
                        .map(|entry| entry.acked_at_ms)
                        .min()
                        .unwrap_or(first.acked_at_ms),
                })
            })
            .collect();
        ranges.sort_by(|a, b| a.session.cmp(&b.session));
        ranges
    }

    /// Acknowledged ranges this node dropped unshipped because a newer epoch fenced them
    /// (the most recent [`MAX_LOST_RANGES`]).
    pub fn lost_unshipped(&self) -> Vec<UnshippedRange> {
        self.replication.lock().lost.iter().cloned().collect()
    }

    /// At-risk windows: the closed ones kept, then the open ones.
    pub fn at_risk_windows(&self) -> Vec<AtRiskWindow> {
        let replication = self.replication.lock();
        let mut windows: Vec<AtRiskWindow> = replication.closed_windows.iter().cloned().collect();
        let mut open: Vec<AtRiskWindow> = replication
            .streams
            .values()
            .filter_map(|health| health.window.clone())
            .collect();
        open.sort_by_key(|window| window.stream);
        windows.extend(open);
        windows
    }
}
