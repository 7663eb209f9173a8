//! Same-version legacy normalisation (dsh-persistence §2.10), applied to a copy when deriving.
//! Stored bytes are never rewritten: untouched events keep their exact data text, and migrated
//! payloads are spliced from the original member texts, so numbers and escapes survive.

use super::error::SessionError;
use super::event::{SessionEvent, SurfaceOp, ASSISTANT_MESSAGE, TOOL_RESULT, USER_MESSAGE};
use super::json::{self, object_members_borrowed, raw_from_built, ObjectText};
use serde_json::value::RawValue;

/// An object's members borrowed from its text (`json::object_members_borrowed`): the
/// migration splices member texts, so copying each value first would be wasted.
type Members<'text> = Vec<(String, &'text RawValue)>;

/// The read-side view of a stored log after migration.
#[derive(Debug, Clone)]
pub struct MigratedLog {
    pub events: Vec<SessionEvent>,
    /// Seqs whose payload or type was rewritten.
    pub migrated_seqs: Vec<u64>,
}

/// Upgrades pre-current shapes and refuses removed ones, like DSH's `adoptStoredEvents`.
pub fn migrate_legacy(
    session_id: &str,
    stored: &[SessionEvent],
) -> Result<MigratedLog, SessionError> {
    let mut log = MigratedLog {
        events: Vec::with_capacity(stored.len()),
        migrated_seqs: Vec::new(),
    };
    for event in stored {
        refuse_removed(session_id, event)?;
        let migrated = migrate_event(session_id, event, &log.events)?;
        if let Some(migrated) = migrated {
            log.migrated_seqs.push(event.seq);
            log.events.push(migrated);
        } else {
            log.events.push(event.clone());
        }
    }
    Ok(log)
}

/// Whether [`migrate_legacy`] would refuse `event` (`Err`) or rewrite it (`Ok(true)`); a
/// log none of whose events it refuses or rewrites migrates to itself.
pub fn needs_migration(session_id: &str, event: &SessionEvent) -> Result<bool, SessionError> {
    refuse_removed(session_id, event)?;
    // The earlier events only supply the id a rewritten replacement inherits.
    Ok(is_migrated_type(&event.event_type) && migrate_event(session_id, event, &[])?.is_some())
}

/// The types `migrate_event` may rewrite (any other it leaves as it is).
fn is_migrated_type(event_type: &str) -> bool {
    matches!(
        event_type,
        "turn/start"
            | "turn/end"
            | "steering/message"
            | USER_MESSAGE
            | ASSISTANT_MESSAGE
            | TOOL_RESULT
    )
}

/// [`migrate_legacy`] of one event of a log read as a stream: `Some(Ok(Some(migrated)))`
/// when it rewrites the event, `Some(Ok(None))` when it leaves it, `Some(Err(_))` when it
/// refuses it; `None` when the rewrite needs the earlier events (a legacy replacement
/// result inherits the message id of the result it replaces): the caller then migrates
/// the whole log.
pub fn migrate_next(
    session_id: &str,
    event: &SessionEvent,
) -> Option<Result<Option<SessionEvent>, SessionError>> {
    if let Err(error) = refuse_removed(session_id, event) {
        return Some(Err(error));
    }
    if !is_migrated_type(&event.event_type) {
        return Some(Ok(None));
    }
    let migrated = migrate_event(session_id, event, &[]);
    let inherits = event.event_type == TOOL_RESULT
        && matches!(event.surface_op, Some(SurfaceOp::Replace { .. }))
        && matches!(migrated, Ok(Some(_)));
    (!inherits).then_some(migrated)
}

fn refuse_removed(session_id: &str, event: &SessionEvent) -> Result<(), SessionError> {
    let unsupported = |event_type: &str| SessionError::LegacyUnsupportedType {
        session_id: session_id.to_owned(),
        event_type: event_type.to_owned(),
        seq: event.seq,
    };
    match event.event_type.as_str() {
        "request/header-delta" | "mode/set" => Err(unsupported(&event.event_type)),
        "request/header" if is_string_member(event.data.get(), "reason", "fallback") => {
            Err(SessionError::LegacyFallbackReason {
                session_id: session_id.to_owned(),
                seq: event.seq,
            })
        }
        _ => Ok(()),
    }
}

fn is_string_member(object_text: &str, key: &str, expected: &str) -> bool {
    json::member(object_text, key).is_some_and(|raw| raw.get() == json::string_text(expected))
}

fn legacy_id(session_id: &str, seq: u64) -> String {
    format!("legacy-message:{session_id}:{seq}")
}

/// The migrated copy of `event`, or `None` when it already has the current shape.
fn migrate_event(
    session_id: &str,
    event: &SessionEvent,
    earlier: &[SessionEvent],
) -> Result<Option<SessionEvent>, SessionError> {
    let Some(members) = object_members_borrowed(event.data.get()) else {
        return Ok(None);
    };
    let has = |key: &str| members.iter().any(|(name, _)| name == key);
    let data = match event.event_type.as_str() {
        "turn/start" if has("trigger") => Some(migrate_turn_start(&members)?),
        "turn/end" => migrate_turn_end(&members)?,
        "steering/message" => Some(migrate_steering(session_id, event.seq, &members)?),
        USER_MESSAGE if !has("id") || !has("role") => {
            Some(identify_user(session_id, event.seq, &members))
        }
        ASSISTANT_MESSAGE if !has("message") && has("content") => {
            Some(identify_assistant(session_id, event.seq, &members))
        }
        TOOL_RESULT if !has("message") && has("callId") => {
            let id = inherited_id(event, earlier)
                .unwrap_or_else(|| json::string_text(&legacy_id(session_id, event.seq)));
            Some(identify_tool_result(&id, &members))
        }
        _ => None,
    };
    Ok(data.map(|data| {
        let event_type = if event.event_type == "steering/message" {
            USER_MESSAGE
        } else {
            &event.event_type
        };
        SessionEvent {
            event_type: event_type.to_owned(),
            data: raw_from_built(data),
            ..event.clone()
        }
    }))
}

fn value_of<'members>(members: &'members Members<'_>, key: &str) -> Option<&'members str> {
    members
        .iter()
        .find(|(name, _)| name == key)
        .map(|(_, value)| value.get())
}

/// Room for a member's punctuation in an object text: quotes, colon, comma.
const MEMBER_PUNCTUATION_BYTES: usize = 4;

/// Room for what a migration adds to a payload besides its members (ids, roles, a
/// wrapping `message`), in bytes.
const MIGRATION_EXTRA_BYTES: usize = 256;

fn without(members: &Members<'_>, keys: &[&str]) -> ObjectText {
    let kept = || {
        members
            .iter()
            .filter(|(name, _)| !keys.contains(&name.as_str()))
    };
    // Sized for all the members (those left out too: `identify_assistant` adds them back
    // inside `message`).
    let bytes: usize = members
        .iter()
        .map(|(name, value)| name.len() + value.get().len() + MEMBER_PUNCTUATION_BYTES)
        .sum();
    kept().fold(
        ObjectText::with_capacity(bytes + MIGRATION_EXTRA_BYTES),
        |object, (name, value)| object.raw(name, value.get()),
    )
}

/// `turn/start {turn, trigger}` → `{turn}`; turn ≥ 1 and a non-empty `trigger.kind`.
fn migrate_turn_start(members: &Members<'_>) -> Result<String, SessionError> {
    let malformed = || SessionError::MalformedLegacy {
        event_type: "turn/start".to_owned(),
    };
    let turn = value_of(members, "turn").ok_or_else(malformed)?;
    let trigger_kind = value_of(members, "trigger")
        .and_then(|trigger| json::member(trigger, "kind"))
        .and_then(|kind| serde_json::from_str::<String>(kind.get()).ok());
    let turn_ok = json::js_number(turn).is_some_and(|number| number >= 1.0);
    if members.len() != 2
        || !turn_ok
        || !matches!(trigger_kind.as_deref(), Some(kind) if !kind.is_empty())
    {
        return Err(malformed());
    }
    Ok(ObjectText::new().raw("turn", turn).finish())
}

/// Old `turn/end` reasons → the current `TurnEndReason` (unknown kinds pass through).
fn migrate_turn_end(members: &Members<'_>) -> Result<Option<String>, SessionError> {
    let malformed = || SessionError::MalformedLegacy {
        event_type: "turn/end".to_owned(),
    };
    let Some(reason) = value_of(members, "reason").and_then(object_members_borrowed) else {
        return Ok(None);
    };
    let kind = value_of(&reason, "kind").and_then(|kind| serde_json::from_str::<String>(kind).ok());
    let has = |key: &str| reason.iter().any(|(name, _)| name == key);
    let new_reason = match kind.as_deref() {
        Some("completed" | "blocked" | "max-tokens" | "interrupted") if reason.len() != 1 => {
            return Err(malformed())
        }
        Some("aborted") if !has("reason") => {
            r#"{"kind":"aborted","reason":{"kind":"legacy"}}"#.to_owned()
        }
        Some("disposed") => r#"{"kind":"aborted","reason":{"kind":"disposed"}}"#.to_owned(),
        Some("error") if has("failure") => {
            let failure = value_of(&reason, "failure").ok_or_else(malformed)?;
            ObjectText::new()
                .string("kind", "error")
                .raw("error", failure)
                .finish()
        }
        Some("error") if has("message") => {
            let message = value_of(&reason, "message").ok_or_else(malformed)?;
            let code = value_of(&reason, "code")
                .map_or_else(|| json::string_text("UNKNOWN"), str::to_owned);
            let error = ObjectText::new()
                .raw("message", message)
                .raw("code", &code)
                .finish();
            ObjectText::new()
                .string("kind", "error")
                .raw("error", &error)
                .finish()
        }
        _ => return Ok(None),
    };
    let rebuilt = members
        .iter()
        .fold(ObjectText::new(), |object, (name, value)| {
            object.raw(
                name,
                if name == "reason" {
                    &new_reason
                } else {
                    value.get()
                },
            )
        });
    Ok(Some(rebuilt.finish()))
}

/// `steering/message {turn, message}` → the message; flat `{turn, content, source}` → an
/// identified user message.
fn migrate_steering(
    session_id: &str,
    seq: u64,
    members: &Members<'_>,
) -> Result<String, SessionError> {
    if let Some(message) = value_of(members, "message") {
        return Ok(message.to_owned());
    }
    match (value_of(members, "content"), value_of(members, "source")) {
        (Some(content), Some(source)) => Ok(ObjectText::new()
            .raw("content", content)
            .raw("source", source)
            .string("id", &legacy_id(session_id, seq))
            .string("role", "user")
            .finish()),
        _ => Err(SessionError::MalformedLegacy {
            event_type: "steering/message".to_owned(),
        }),
    }
}

fn identify_user(session_id: &str, seq: u64, members: &Members<'_>) -> String {
    let mut object = without(members, &[]);
    if value_of(members, "id").is_none() {
        object = object.string("id", &legacy_id(session_id, seq));
    }
    if value_of(members, "role").is_none() {
        object = object.string("role", "user");
    }
    object.finish()
}

/// `{…rest, content, provenance}` → `{…rest, message:{id, role, content, source:{…provenance, kind}}}`.
fn identify_assistant(session_id: &str, seq: u64, members: &Members<'_>) -> String {
    let provenance = value_of(members, "provenance")
        .and_then(object_members_borrowed)
        .unwrap_or_default();
    let mut source = without(&provenance, &[]);
    let kind_position = provenance.iter().position(|(name, _)| name == "kind");
    if kind_position.is_some() {
        // JS spread keeps an existing `kind` in place while overwriting its value.
        source = provenance
            .iter()
            .fold(ObjectText::new(), |object, (name, value)| {
                if name == "kind" {
                    object.string("kind", "model")
                } else {
                    object.raw(name, value.get())
                }
            });
    } else {
        source = source.string("kind", "model");
    }
    let content = value_of(members, "content").unwrap_or("[]");
    let message = ObjectText::with_capacity(content.len() + MIGRATION_EXTRA_BYTES)
        .string("id", &legacy_id(session_id, seq))
        .string("role", "assistant")
        .raw("content", content)
        .raw("source", &source.finish())
        .finish();
    without(members, &["content", "provenance"])
        .raw("message", &message)
        .finish()
}

/// `{…rest, callId, content, isError}` → `{…rest, message:{id, role, content:[tool-result], source}}`.
fn identify_tool_result(id_text: &str, members: &Members<'_>) -> String {
    let call_id = value_of(members, "callId").unwrap_or("null");
    let content = value_of(members, "content").unwrap_or("[]");
    let room = content.len() + MIGRATION_EXTRA_BYTES;
    let mut block = ObjectText::with_capacity(room)
        .string("type", "tool-result")
        .raw("toolCallId", call_id)
        .raw("content", content);
    if let Some(is_error) = value_of(members, "isError") {
        block = block.raw("isError", is_error);
    }
    let source = ObjectText::new()
        .string("kind", "tool")
        .raw("callId", call_id)
        .finish();
    let message = ObjectText::with_capacity(room)
        .raw("id", id_text)
        .string("role", "user")
        .raw("content", &format!("[{}]", block.finish()))
        .raw("source", &source)
        .finish();
    without(members, &["callId", "content", "isError"])
        .raw("message", &message)
        .finish()
}

/// A legacy replacement result keeps the message id of the result it replaces.
fn inherited_id(event: &SessionEvent, earlier: &[SessionEvent]) -> Option<String> {
    let Some(SurfaceOp::Replace { start, .. }) = event.surface_op else {
        return None;
    };
    let target = earlier
        .iter()
        .rev()
        .find(|candidate| candidate.seq == start)?;
    let message = json::member(target.data.get(), "message")?;
    json::member(message.get(), "id").map(|id| id.get().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event_type: &str, seq: u64, data: &str) -> SessionEvent {
        SessionEvent::new(event_type, seq, 0, data).expect("test data is JSON")
    }

    fn migrated_data(event_type: &str, data: &str) -> Result<String, SessionError> {
        let log = migrate_legacy("s", &[event(event_type, 3, data)])?;
        Ok(log.events[0].data.get().to_owned())
    }

    #[test]
    fn turn_end_reasons_upgrade_like_dsh() {
        let cases = [
            (
                r#"{"turn":1,"reason":{"kind":"aborted"}}"#,
                r#"{"turn":1,"reason":{"kind":"aborted","reason":{"kind":"legacy"}}}"#,
            ),
            (
                r#"{"turn":1,"reason":{"kind":"disposed"}}"#,
                r#"{"turn":1,"reason":{"kind":"aborted","reason":{"kind":"disposed"}}}"#,
            ),
            (
                r#"{"turn":1,"reason":{"kind":"error","step":2,"message":"m"}}"#,
                r#"{"turn":1,"reason":{"kind":"error","error":{"message":"m","code":"UNKNOWN"}}}"#,
            ),
            (
                r#"{"turn":1,"reason":{"kind":"error","step":2,"failure":{"message":"m","code":"C"}}}"#,
                r#"{"turn":1,"reason":{"kind":"error","error":{"message":"m","code":"C"}}}"#,
            ),
            (
                r#"{"turn":1,"reason":{"kind":"future-kind","x":1}}"#,
                r#"{"turn":1,"reason":{"kind":"future-kind","x":1}}"#,
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(
                migrated_data("turn/end", input).ok().as_deref(),
                Some(expected)
            );
        }
        let extra = migrated_data(
            "turn/end",
            r#"{"turn":1,"reason":{"kind":"completed","x":1}}"#,
        );
        assert_eq!(
            extra.err().map(|e| e.to_string()).as_deref(),
            Some("malformed pre-react-loop turn/end")
        );
    }

    #[test]
    fn removed_shapes_are_refused_with_dsh_texts() {
        let error = migrate_legacy("s", &[event("mode/set", 4, "{}")])
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some("session \"s\" contains unsupported legacy mode/set event at seq 4")
        );
        let fallback = event("request/header", 2, r#"{"reason":"fallback"}"#);
        let error = migrate_legacy("s", &[fallback])
            .err()
            .map(|e| e.to_string());
        assert_eq!(error.as_deref(), Some("session \"s\" contains unsupported legacy request/header reason \"fallback\" at seq 2"));
    }

    #[test]
    fn steering_and_replacement_results_migrate() {
        let steering = migrated_data(
            "steering/message",
            r#"{"turn":1,"content":[],"source":{"kind":"user"}}"#,
        );
        assert_eq!(
            steering.ok().as_deref(),
            Some(
                r#"{"content":[],"source":{"kind":"user"},"id":"legacy-message:s:3","role":"user"}"#
            )
        );
        let original = event("tool/result", 0, r#"{"callId":"c","content":[]}"#);
        let mut replacement = event(
            "tool/result",
            1,
            r#"{"callId":"c","content":[{"type":"text","text":"x"}]}"#,
        );
        replacement.surface_op = Some(SurfaceOp::Replace { start: 0, end: 0 });
        let log = migrate_legacy("s", &[original, replacement]);
        let texts: Vec<String> = log
            .map(|log| log.events.iter().map(|e| e.data.get().to_owned()).collect())
            .unwrap_or_default();
        assert_eq!(texts.len(), 2);
        assert!(
            texts
                .iter()
                .all(|text| text.contains(r#""id":"legacy-message:s:0""#)),
            "{texts:?}"
        );
    }
}
