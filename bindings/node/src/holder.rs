//! Who holds a store, where a store is, and the torn-tail test hook's file surgery.

use dshdb::storage::frame::{peek_frame, FRAME_HEADER_BYTES};
use dshdb::storage::segment::{parse_segment_name, SEGMENT_HEADER_BYTES, WAL_DIR};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The store directory's device and inode.
pub fn store_source(path: &str) -> io::Result<(u64, u64)> {
    let metadata = std::fs::metadata(path)?;
    Ok((metadata.dev(), metadata.ino()))
}

/// The refusal text for a store whose writer lock another open holds: it names the store
/// and, where `/proc/locks` tells, the holding process.
pub fn locked_message(path: &str) -> String {
    let store = std::fs::canonicalize(path)
        .map(|full| full.display().to_string())
        .unwrap_or_else(|_| path.to_string());
    let holder = match lock_holder(Path::new(path)) {
        Some(pid) if pid == std::process::id() => format!(
            "this process (pid {pid}) through another open handle: close it (dispose the other provider) first"
        ),
        Some(pid) => {
            let command = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|bytes| {
                    String::from_utf8_lossy(&bytes)
                        .split('\0')
                        .filter(|part| !part.is_empty())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            if command.is_empty() {
                format!("process {pid}")
            } else {
                format!("process {pid} ({command})")
            }
        }
        None => "another process (its pid is unknown)".to_string(),
    };
    format!(
        "dshdb store \"{store}\" is locked: it is open for writing by {holder}; one process at a time may open a dshdb store"
    )
}

/// The pid holding the flock on `<store>/LOCK`, from `/proc/locks` (Linux).
fn lock_holder(store: &Path) -> Option<u32> {
    let inode = std::fs::metadata(store.join(dshdb::store::LOCK_FILE))
        .ok()?
        .ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flock = fields.get(1) == Some(&"FLOCK");
        let file_inode = fields.get(5)?.rsplit(':').next()?.parse::<u64>().ok()?;
        if flock && file_inode == inode {
            fields.get(4)?.parse::<u32>().ok()
        } else {
            None
        }
    })
}

/// A frame header of all zero bytes is the unwritten end of a segment.
fn zero_header(bytes: &[u8]) -> bool {
    bytes.iter().take(FRAME_HEADER_BYTES).all(|byte| *byte == 0)
}

/// See `test_tear_last_batch`.
pub fn tear_last_batch(store: &Path, cut_bytes: usize) -> io::Result<u32> {
    let wal = store.join(WAL_DIR);
    let newest = std::fs::read_dir(&wal)?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().to_string();
            parse_segment_name(&name).map(|id| (id, entry.path()))
        })
        .max_by_key(|(id, _)| *id)
        .ok_or_else(|| io::Error::other("no write-ahead segment"))?
        .1;
    let mut bytes = std::fs::read(&newest)?;
    let header = usize::try_from(SEGMENT_HEADER_BYTES).map_err(io::Error::other)?;
    let mut frames = Vec::new();
    let mut offset = header;
    while offset < bytes.len() {
        match peek_frame(&bytes[offset..]) {
            Ok(frame) if !zero_header(&bytes[offset..]) => {
                frames.push(offset);
                offset += frame.total_bytes;
            }
            _ => break,
        }
    }
    // The last frame is the seal written at close; the one before ends the last batch.
    let (Some(&seal), true) = (frames.last(), frames.len() >= 2) else {
        return Err(io::Error::other("the newest segment holds no sealed batch"));
    };
    let start = seal
        .checked_sub(cut_bytes)
        .filter(|start| *start >= header)
        .ok_or_else(|| io::Error::other("cut reaches the segment header"))?;
    bytes[start..offset].fill(0);
    std::fs::write(&newest, &bytes)?;
    match std::fs::remove_file(store.join(dshdb::storage::index::CHECKPOINT_FILE)) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    u32::try_from(offset - start).map_err(io::Error::other)
}
