//! Names: which shard a session belongs to, and the subjects, keys and object keys of it.
//!
//! `shard = u64::from_le_bytes(blake3(sid)[0..8]) % 1024`. FLEET.md names xxh3; blake3 is
//! used instead because the engine already depends on it and its output is fixed by its
//! specification (any implementation, any platform, any version gives the same shard). The
//! count is fixed at fleet creation: changing it moves every session.

/// Virtual shards of a fleet (Temporal's `numHistoryShards`).
pub const SHARD_COUNT: u32 = 1024;
/// Tail streams `DSH_00..DSH_15`; shard s lives in stream `s % 16`.
pub const STREAM_COUNT: u32 = 16;

/// The shard of session `sid` in a fleet of [`SHARD_COUNT`] shards.
pub fn shard_of(sid: &str) -> u32 {
    shard_of_in(sid, SHARD_COUNT)
}

/// The shard of session `sid` in a fleet of `shard_count` shards (the model tests use few).
pub fn shard_of_in(sid: &str, shard_count: u32) -> u32 {
    let hash = blake3::hash(sid.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    let shard = u64::from_le_bytes(first) % u64::from(shard_count.max(1));
    // Below shard_count, so it fits.
    u32::try_from(shard).unwrap_or(0)
}

/// The stream index k of a shard.
pub fn stream_index(shard: u32) -> u32 {
    shard % STREAM_COUNT
}

/// `DSH_<k>` with k two digits.
pub fn stream_name(shard: u32) -> String {
    format!("DSH_{:02}", stream_index(shard))
}

/// The subjects stream k holds: `dsh.<k>.>`.
pub fn stream_subjects(index: u32) -> String {
    format!("dsh.{index:02}.>")
}

/// `dsh.<k>.<shard>.e`: the shard's epoch markers.
pub fn epoch_subject(shard: u32) -> String {
    format!("dsh.{:02}.{shard}.e", stream_index(shard))
}

/// `dsh.<k>.<shard>.g`: group tail messages of the shard (several sessions' batches each).
pub fn group_subject(shard: u32) -> String {
    format!("dsh.{:02}.{shard}.g", stream_index(shard))
}

/// `dsh.<k>.<shard>.s.<sid>`: the session's tail.
pub fn session_subject(sid: &str, shard: u32) -> String {
    format!("dsh.{:02}.{shard}.s.{sid}", stream_index(shard))
}

/// `<shard>`, the key of `DSH_SHARDS`.
pub fn shard_key(shard: u32) -> String {
    format!("{shard}")
}

/// `<sid>`, the key of `DSH_SESSIONS`.
pub fn session_key(sid: &str) -> String {
    sid.to_string()
}

/// `v1/s/<sid[0..2]>/<sid>/r/<first:016x>-<last:016x>-e<epoch>.dshr`: a run, immutable.
pub fn run_key(sid: &str, first_seq: u64, last_seq: u64, epoch: u64) -> String {
    format!(
        "v1/s/{}/{sid}/r/{first_seq:016x}-{last_seq:016x}-e{epoch}.dshr",
        sid_prefix(sid)
    )
}

/// `v1/s/<sid[0..2]>/<sid>/m/<epoch:016x>-<sealed_end:016x>.json`: a manifest copy.
pub fn manifest_copy_key(sid: &str, epoch: u64, sealed_end: u64) -> String {
    format!(
        "v1/s/{}/{sid}/m/{epoch:016x}-{sealed_end:016x}.json",
        sid_prefix(sid)
    )
}

fn sid_prefix(sid: &str) -> &str {
    let end = sid
        .char_indices()
        .nth(2)
        .map_or(sid.len(), |(index, _)| index);
    &sid[..end]
}

/// Whether `sid` can be a fleet session id: it becomes a NATS subject token and an S3 key
/// segment, so 1..=200 bytes of `[A-Za-z0-9_-]`.
pub fn valid_session_id(sid: &str) -> bool {
    !sid.is_empty()
        && sid.len() <= crate::wire::MAX_SESSION_ID_BYTES
        && sid
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
}

/// Rendezvous (highest random weight) choice of a shard's owner among `nodes`: only a dead
/// node's shards move when it leaves.
pub fn rendezvous_owner(shard: u32, nodes: &[String]) -> Option<&String> {
    nodes.iter().max_by_key(|node| {
        let mut hasher = blake3::Hasher::new();
        hasher.update(&shard.to_le_bytes());
        hasher.update(node.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&hasher.finalize().as_bytes()[..8]);
        (u64::from_le_bytes(first), (*node).clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_hash_is_pinned() {
        // Golden values: a change here moves every session of every fleet.
        let shards: Vec<u32> = ["", "a", "session-1", "chat-42"]
            .iter()
            .map(|sid| shard_of(sid))
            .collect();
        // blake3("") starts af1349b9f5f9a1a6: 0xa6a1f9f5b94913af % 1024 = 943.
        assert_eq!(shards, vec![943, 535, 523, 557]);
    }

    #[test]
    fn names_follow_the_layout() {
        let sid = "chat-42";
        let shard = shard_of(sid);
        assert_eq!(
            session_subject(sid, shard),
            format!("dsh.{:02}.{shard}.s.chat-42", shard % 16)
        );
        assert_eq!(
            run_key(sid, 0, 255, 3),
            "v1/s/ch/chat-42/r/0000000000000000-00000000000000ff-e3.dshr"
        );
        assert!(valid_session_id("a-b_C9"));
        assert!(!valid_session_id("a.b"));
        assert!(!valid_session_id(""));
    }

    #[test]
    fn rendezvous_moves_only_the_dead_nodes_shards() {
        let all: Vec<String> = ["n1", "n2", "n3"].iter().map(|n| n.to_string()).collect();
        let without_n2: Vec<String> = ["n1", "n3"].iter().map(|n| n.to_string()).collect();
        for shard in 0..SHARD_COUNT {
            let before = rendezvous_owner(shard, &all).cloned();
            let after = rendezvous_owner(shard, &without_n2).cloned();
            if before.as_deref() != Some("n2") {
                assert_eq!(before, after, "shard {shard}");
            }
        }
    }
}
