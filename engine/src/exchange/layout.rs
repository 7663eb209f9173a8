//! DSH's sessions-directory layout (persistence §2.2): `encodeSegment`, `projectKey`,
//! discovery of `<root>/--<project>--/<encoded id>/session.jsonl[.zstd]`, and the identity
//! check that binds a stored header to the path it was found at. DSH runs these checks
//! before any repair or append; the importer runs them before it writes anything.
//!
//! DSH works on JavaScript strings, so both encoders work on UTF-16 code units: an id with a
//! lone surrogate escape (`"\ud800"`) encodes as `~D800`, exactly as DSH names its directory.

use super::ExchangeError;
use crate::session::json::member;
use std::path::{Path, PathBuf};

pub use crate::limits::PROJECT_SLUG_MAX_UNITS;
/// The project directory of a session whose header has no `cwd`.
pub const NO_CWD_DIRECTORY: &str = "_no-cwd";
/// The plain-text session log name inside a session directory.
pub const PLAIN_LOG_NAME: &str = "session.jsonl";
/// The zstd session log name inside a session directory.
pub const ZSTD_LOG_NAME: &str = "session.jsonl.zstd";

fn refused(text: String) -> ExchangeError {
    ExchangeError::Refused(text)
}

/// Whether DSH keeps a code unit literally in a path segment (`[A-Za-z0-9._-]`).
fn is_literal(unit: u16) -> bool {
    u8::try_from(unit).is_ok_and(|byte| {
        byte.is_ascii_alphanumeric() || byte == b'.' || byte == b'_' || byte == b'-'
    })
}

fn push_escaped(out: &mut String, unit: u16) {
    out.push_str(&format!("~{unit:04X}"));
}

/// DSH `encodeSegment`: any session id as one safe, injective path segment.
pub fn encode_segment(units: &[u16]) -> Result<String, ExchangeError> {
    if units.is_empty() {
        return Err(refused("cannot encode an empty path segment".to_owned()));
    }
    let dot = u16::from(b'.');
    if units.iter().all(|&unit| unit == dot) && units.len() <= 2 {
        return Ok("~002E".repeat(units.len()));
    }
    let mut out = String::with_capacity(units.len());
    for &unit in units {
        match u8::try_from(unit) {
            Ok(byte) if is_literal(unit) => out.push(char::from(byte)),
            _ => push_escaped(&mut out, unit),
        }
    }
    Ok(out)
}

/// DSH `projectKey`: a readable, lossy project directory name for a working directory.
pub fn project_key(units: &[u16]) -> Result<String, ExchangeError> {
    if units.is_empty() {
        return Err(refused("cannot encode an empty project path".to_owned()));
    }
    let is_separator = |unit: u16| matches!(u8::try_from(unit), Ok(b'/' | b'\\' | b':'));
    let mut slug = String::with_capacity(units.len());
    let mut previous_separator = false;
    for &unit in units {
        if is_separator(unit) {
            if !previous_separator {
                slug.push('-');
            }
            previous_separator = true;
            continue;
        }
        previous_separator = false;
        match u8::try_from(unit) {
            Ok(byte) if is_literal(unit) => slug.push(char::from(byte)),
            _ => push_escaped(&mut slug, unit),
        }
    }
    let trimmed = slug.trim_start_matches('-');
    let slug = if trimmed.is_empty() { "root" } else { trimmed };
    // The slug is ASCII, so byte length equals UTF-16 length.
    let cut = &slug[..slug.len().min(PROJECT_SLUG_MAX_UNITS)];
    Ok(format!("--{cut}--"))
}

/// The UTF-16 code units of a JSON string literal, lone surrogate escapes included.
pub fn json_string_units(literal: &str) -> Option<Vec<u16>> {
    let inner = literal.strip_prefix('"')?.strip_suffix('"')?;
    let mut units = Vec::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(character) = chars.next() {
        if character != '\\' {
            let mut buffer = [0u16; 2];
            units.extend_from_slice(character.encode_utf16(&mut buffer));
            continue;
        }
        let unit = match chars.next()? {
            '"' => u16::from(b'"'),
            '\\' => u16::from(b'\\'),
            '/' => u16::from(b'/'),
            'b' => 0x08,
            'f' => 0x0C,
            'n' => u16::from(b'\n'),
            'r' => u16::from(b'\r'),
            't' => u16::from(b'\t'),
            'u' => {
                let hex: String = chars.by_ref().take(4).collect();
                if hex.len() != 4 {
                    return None;
                }
                u16::from_str_radix(&hex, 16).ok()?
            }
            _ => return None,
        };
        units.push(unit);
    }
    Some(units)
}

/// A session log found under a DSH sessions root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionArtifact {
    /// The project directory name (`--<slug>--` or `_no-cwd`).
    pub project: String,
    /// The session directory name (the encoded id).
    pub session_directory: String,
    /// The log file.
    pub path: PathBuf,
    /// Whether the log is `session.jsonl.zstd`.
    pub zstd: bool,
}

fn io_refusal(path: &Path, error: std::io::Error) -> ExchangeError {
    refused(format!("cannot read \"{}\": {error}", path.display()))
}

fn sorted_entries(directory: &Path) -> Result<Vec<PathBuf>, ExchangeError> {
    let mut entries = std::fs::read_dir(directory)
        .map_err(|error| io_refusal(directory, error))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|error| io_refusal(directory, error))?;
    entries.sort();
    Ok(entries)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn is_flat_log(name: &str) -> bool {
    name.ends_with(".jsonl") || name.ends_with(".jsonl.zstd")
}

fn suffix(zstd: bool) -> &'static str {
    if zstd {
        ".jsonl.zstd"
    } else {
        ".jsonl"
    }
}

fn compression_name(zstd: bool) -> &'static str {
    if zstd {
        "zstd"
    } else {
        "none"
    }
}

fn mixed_encoding(path: &Path, zstd: bool) -> ExchangeError {
    refused(format!(
        "session artifact \"{}\" uses {}, but this backend is configured for compression \"{}\"; use a separate root or select the matching compression mode",
        path.display(),
        suffix(zstd),
        compression_name(!zstd)
    ))
}

/// Whether `entry` (a link or not) resolves to a place inside `root` (already resolved): a
/// sessions root is scanned only within itself, whatever links it holds.
fn resolves_inside(entry: &Path, root: &Path) -> bool {
    std::fs::canonicalize(entry).is_ok_and(|resolved| resolved.starts_with(root))
}

/// The session logs of one project directory, refusing DSH's legacy flat-file layout.
/// Links out of `root` are skipped into `outside`.
fn project_sessions(
    project: &Path,
    root: &Path,
    out: &mut Vec<SessionArtifact>,
    outside: &mut Vec<PathBuf>,
) -> Result<(), ExchangeError> {
    for entry in sorted_entries(project)? {
        let name = file_name(&entry);
        if !resolves_inside(&entry, root) {
            outside.push(entry);
            continue;
        }
        if !entry.is_dir() {
            if is_flat_log(&name) {
                return Err(refused(format!(
                    "session artifact \"{}\" uses the unsupported flat-file layout; use a separate root or move it into a project/session directory before loading",
                    entry.display()
                )));
            }
            continue;
        }
        for zstd in [false, true] {
            let log_name = if zstd { ZSTD_LOG_NAME } else { PLAIN_LOG_NAME };
            let path = entry.join(log_name);
            if path.is_file() {
                if !resolves_inside(&path, root) {
                    outside.push(path);
                    continue;
                }
                out.push(SessionArtifact {
                    project: file_name(project),
                    session_directory: name.clone(),
                    path,
                    zstd,
                });
            }
        }
    }
    Ok(())
}

/// What a directory import found: the session logs, and the links it did not follow
/// because they lead out of the sessions root.
#[derive(Debug, Default)]
pub struct Discovered {
    pub artifacts: Vec<SessionArtifact>,
    /// Entries under the root that resolve outside it (symbolic links), not scanned.
    pub outside_links: Vec<PathBuf>,
}

/// Finds every session log under a DSH sessions root as DSH's `list()` does: project
/// directories directly under the root, session directories directly under those. Refuses
/// a flat-file layout, a root that mixes both encodings (the first log found sets the
/// encoding, as DSH's backend configuration would), and an id found in two projects.
/// Links that lead out of the root are not followed (`ln -s ../..` never makes it scan
/// above the root); they are listed in [`Discovered::outside_links`].
pub fn discover_sessions(root: &Path) -> Result<Discovered, ExchangeError> {
    let resolved_root = std::fs::canonicalize(root).map_err(|error| io_refusal(root, error))?;
    let mut found = Vec::new();
    let mut outside = Vec::new();
    for project in sorted_entries(root)? {
        if !resolves_inside(&project, &resolved_root) {
            outside.push(project);
            continue;
        }
        if project.is_dir() {
            project_sessions(&project, &resolved_root, &mut found, &mut outside)?;
        }
    }
    if let Some(first) = found.first() {
        let encoding = first.zstd;
        if let Some(other) = found.iter().find(|artifact| artifact.zstd != encoding) {
            return Err(mixed_encoding(&other.path, other.zstd));
        }
    }
    for (index, artifact) in found.iter().enumerate() {
        let duplicate = found[..index]
            .iter()
            .any(|earlier| earlier.session_directory == artifact.session_directory);
        if duplicate {
            let id = decode_segment(&artifact.session_directory)
                .unwrap_or_else(|| artifact.session_directory.clone());
            return Err(refused(format!(
                "duplicate JSONL session id \"{id}\" appears in multiple project directories"
            )));
        }
    }
    Ok(Discovered {
        artifacts: found,
        outside_links: outside,
    })
}

/// The session logs under a directory given to an import: a sessions root, or one session
/// directory (it holds the log itself; its parent is the project directory).
pub fn discover_directory(directory: &Path) -> Result<Discovered, ExchangeError> {
    let holds_log = [PLAIN_LOG_NAME, ZSTD_LOG_NAME]
        .iter()
        .any(|name| directory.join(name).is_file());
    if !holds_log {
        return discover_sessions(directory);
    }
    let absolute =
        std::fs::canonicalize(directory).map_err(|error| io_refusal(directory, error))?;
    let project = absolute.parent().map(file_name).unwrap_or_default();
    let mut found = Vec::new();
    for zstd in [false, true] {
        let path = directory.join(if zstd { ZSTD_LOG_NAME } else { PLAIN_LOG_NAME });
        if path.is_file() {
            found.push(SessionArtifact {
                project: project.clone(),
                session_directory: file_name(&absolute),
                path,
                zstd,
            });
        }
    }
    if let [_, zstd] = found.as_slice() {
        return Err(mixed_encoding(&zstd.path, zstd.zstd));
    }
    Ok(Discovered {
        artifacts: found,
        outside_links: Vec::new(),
    })
}

/// The id a session directory name encodes (lone surrogates shown as U+FFFD), if it is a
/// well-formed `encodeSegment` output.
pub fn decode_segment(segment: &str) -> Option<String> {
    let mut units = Vec::with_capacity(segment.len());
    let bytes = segment.as_bytes();
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'~' {
            let hex = segment.get(index + 1..index + 5)?;
            units.push(u16::from_str_radix(hex, 16).ok()?);
            index += 5;
        } else {
            units.push(u16::from(bytes[index]));
            index += 1;
        }
    }
    Some(String::from_utf16_lossy(&units))
}

fn header_string_units(header_line: &str, key: &str) -> Option<Vec<u16>> {
    member(header_line, key).and_then(|raw| json_string_units(raw.get()))
}

/// DSH's identity check: the header's id must be the one the session directory names, and
/// `logPath(root, cwd, id)` must be the path the log was found at.
pub fn check_identity(
    artifact: &SessionArtifact,
    header_line: &str,
    header_id: &str,
) -> Result<(), ExchangeError> {
    let path = artifact.path.display();
    let corrupt = |detail: String| refused(format!("corrupt session log \"{path}\": {detail}"));
    let id_units = header_string_units(header_line, "id").unwrap_or_default();
    let encoded_id = encode_segment(&id_units)
        .map_err(|_| corrupt("header id cannot name a storage path".to_owned()))?;
    if encoded_id != artifact.session_directory {
        let requested = decode_segment(&artifact.session_directory)
            .unwrap_or_else(|| artifact.session_directory.clone());
        return Err(corrupt(format!(
            "requested id \"{requested}\" does not match header id \"{header_id}\""
        )));
    }
    let project = match header_string_units(header_line, "cwd") {
        Some(cwd) => project_key(&cwd)?,
        None => NO_CWD_DIRECTORY.to_owned(),
    };
    if project != artifact.project {
        let root = artifact
            .path
            .parent()
            .and_then(Path::parent)
            .and_then(Path::parent)
            .unwrap_or_else(|| Path::new(""));
        let log_name = if artifact.zstd {
            ZSTD_LOG_NAME
        } else {
            PLAIN_LOG_NAME
        };
        let expected = root.join(project).join(&encoded_id).join(log_name);
        return Err(corrupt(format!(
            "header id \"{header_id}\" and cwd identify \"{}\"",
            expected.display()
        )));
    }
    Ok(())
}

/// The header line of a session log's bytes: the first line, or the first zstd frame.
fn header_line(bytes: &[u8], zstd: bool) -> Option<String> {
    if zstd {
        // Bounded: a bomb in the first frame decodes no further than one line's limit.
        return String::from_utf8(super::bounded::first_frame_line(bytes)?).ok();
    }
    let end = bytes.iter().position(|&byte| byte == b'\n')?;
    String::from_utf8(bytes[..end].to_vec()).ok()
}

/// Checks a discovered log's identity from its bytes. A header DSH would refuse anyway is
/// left to the importer, which refuses it with DSH's own text.
pub fn check_artifact(artifact: &SessionArtifact, bytes: &[u8]) -> Result<(), ExchangeError> {
    let Some(line) = header_line(bytes, artifact.zstd) else {
        return Ok(());
    };
    match super::scan::check_header(&line) {
        Ok(header_id) => check_identity(artifact, &line, &header_id),
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(text: &str) -> Vec<u16> {
        text.encode_utf16().collect()
    }

    #[test]
    fn encode_segment_matches_dsh_vectors() {
        let cases = [
            ("a/b", "a~002Fb"),
            ("/etc/passwd", "~002Fetc~002Fpasswd"),
            ("a\u{0}b", "a~0000b"),
            ("plain-ID_1.2", "plain-ID_1.2"),
            ("a~b", "a~007Eb"),
            (".", "~002E"),
            ("..", "~002E~002E"),
            ("...", "..."),
        ];
        for (id, expected) in cases {
            assert_eq!(
                encode_segment(&units(id)).ok().as_deref(),
                Some(expected),
                "{id}"
            );
        }
        assert_eq!(encode_segment(&[0xD800]).ok().as_deref(), Some("~D800"));
        assert!(encode_segment(&[]).is_err());
    }

    #[test]
    fn project_key_matches_dsh_vectors() {
        let cases = [
            (
                "/Users/qyj/work/deepseek-harness",
                "--Users-qyj-work-deepseek-harness--",
            ),
            ("C:\\work\\agent", "--C-work-agent--"),
            ("/开发/~agent", "--~5F00~53D1-~007Eagent--"),
            ("/", "--root--"),
        ];
        for (cwd, expected) in cases {
            assert_eq!(
                project_key(&units(cwd)).ok().as_deref(),
                Some(expected),
                "{cwd}"
            );
        }
        let long = format!("/{}", "x".repeat(1000));
        assert_eq!(
            project_key(&units(&long)).map(|key| key.len()).ok(),
            Some(255)
        );
        assert_eq!(
            project_key(&units("/a/b-c")).ok(),
            project_key(&units("/a-b/c")).ok()
        );
        assert!(project_key(&[]).is_err());
    }

    #[test]
    fn json_string_units_keep_lone_surrogates() {
        assert_eq!(
            json_string_units(r#""a\ud800b""#),
            Some(vec![97, 0xD800, 98])
        );
        assert_eq!(json_string_units(r#""\u00e9\n""#), Some(vec![0xE9, 10]));
        assert_eq!(json_string_units("\"é\""), Some(vec![0xE9]));
        assert_eq!(json_string_units(r#""\x""#), None);
    }

    #[test]
    fn decode_segment_inverts_encode_segment() {
        for id in ["a/b", "plain", "a~b", "开发", "..", "."] {
            let encoded = encode_segment(&units(id)).ok();
            assert_eq!(
                encoded.as_deref().and_then(decode_segment).as_deref(),
                Some(id)
            );
        }
    }
}
