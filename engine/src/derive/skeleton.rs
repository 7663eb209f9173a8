//! The *skeleton* of a message-bearing payload: the payload as a `serde_json::Value` with
//! every part that no cold-load check reads left out, plus the exact text of the message it
//! carries. One pass over the payload, in which the left-out parts (message text, tool-call
//! arguments, tool-result content: almost all the bytes) are scanned but never built.
//!
//! What the cold-load checks read of a `user/message` (message = the payload),
//! `assistant/message` or `tool/result` (message = `payload.message`) payload, and so what
//! the skeleton keeps exactly:
//! - message-shape check (model §1.7): message `id`, `role`, `source.kind` (and `provider`,
//!   `model` for assistants, `callId` for tool results), whether `content` is an array, and
//!   for a tool result its one block's `type`, `toolCallId` and whether its `content` is an
//!   array;
//! - repair scan: payload `step`, each assistant content block's `type` and `id`, a tool
//!   result's `source.callId`;
//! - surface fold: for a tool result, the rewrite key (the payload with the first block's
//!   `content` nulled: so everything but that `content`), and for an assistant message
//!   whether its content is empty.
//!
//! Left out: of an assistant payload every member but `step` and `message`; of a user or
//! assistant message every member but `id`, `role`, `source` and `content`, every
//! `source` member but `kind`, `provider`, `model`, `callId`, and every content block but
//! the `type` and `id` of a tool call (any other block is `null`); of a tool result only the `content` of each content block (kept as
//! `[]` when it is an array, so the shape check still sees an array, else `null`). The rest
//! is kept as parsed.
//!
//! Duplicate keys resolve last-wins in first position, as a `Value` parse does.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::fmt;

/// A payload's skeleton and its message text.
pub(crate) struct Skeleton {
    pub value: Value,
    /// The exact text of the carried message (`None` when the payload has no `message`).
    pub message: Option<String>,
}

/// Parses the skeleton of the payload `data` of an event of `event_type` (one of the three
/// message-bearing types); `None` when the text does not parse this way (the caller then
/// parses the whole payload).
pub(crate) fn parse(event_type: &str, data: &str) -> Option<Skeleton> {
    let tool_result = event_type == crate::session::event::TOOL_RESULT;
    if event_type == crate::session::event::USER_MESSAGE {
        let message: &RawValue = serde_json::from_str(data).ok()?;
        let value = parse_message(message.get(), false)?;
        return Some(Skeleton {
            value,
            message: Some(message.get().to_owned()),
        });
    }
    let mut deserializer = serde_json::Deserializer::from_str(data);
    let skeleton = PayloadSeed { tool_result }
        .deserialize(&mut deserializer)
        .ok()?;
    deserializer.end().ok()?;
    Some(skeleton)
}

fn parse_message(text: &str, tool_result: bool) -> Option<Value> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = Part::Message { tool_result }
        .deserialize(&mut deserializer)
        .ok()?;
    deserializer.end().ok()?;
    Some(value)
}

/// The payload of an `assistant/message` or `tool/result`: `message` captured and parsed,
/// every other member kept.
struct PayloadSeed {
    tool_result: bool,
}

impl<'de> DeserializeSeed<'de> for PayloadSeed {
    type Value = Skeleton;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Skeleton, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PayloadSeed {
    type Value = Skeleton;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skeleton, A::Error> {
        let mut members = Map::new();
        let mut message = None;
        while let Some(key) = map.next_key::<String>()? {
            reject_number_token(&key)?;
            if key == "message" {
                let raw: &'de RawValue = map.next_value()?;
                let parsed = parse_message(raw.get(), self.tool_result)
                    .ok_or_else(|| serde::de::Error::custom("message skeleton"))?;
                members.insert(key, parsed);
                message = Some(raw.get().to_owned());
            } else if self.tool_result || key == "step" {
                members.insert(key, map.next_value()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Skeleton {
            value: Value::Object(members),
            message,
        })
    }
}

/// With `arbitrary_precision`, serde_json hands a number to `deserialize_any` as a map with
/// this one key; the skeleton does not rebuild numbers where it expects an object, so such a
/// payload is parsed whole instead.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

fn reject_number_token<E: serde::de::Error>(key: &str) -> Result<(), E> {
    if key == NUMBER_TOKEN {
        return Err(E::custom("a number where the skeleton expects an object"));
    }
    Ok(())
}

/// Where in a message the parser is, which decides what it keeps.
#[derive(Clone, Copy)]
enum Part {
    /// The message object.
    Message { tool_result: bool },
    /// `message.content`.
    Content { tool_result: bool },
    /// One content block.
    Block { tool_result: bool },
    /// `message.source` of a user or assistant message.
    Source,
    /// A tool-result block's `content`: `[]` if an array, else `null`.
    ArrayKind,
}

impl Part {
    /// What a member `key` of an object at this part becomes: `Some(part)` to descend,
    /// `None` to keep it as parsed; `Err(())` to leave it out.
    fn member(self, key: &str) -> Result<Option<Part>, ()> {
        match self {
            Part::Message { tool_result: true } => Ok(match key {
                "content" => Some(Part::Content { tool_result: true }),
                _ => None,
            }),
            Part::Message { tool_result: false } => match key {
                "content" => Ok(Some(Part::Content { tool_result: false })),
                "source" => Ok(Some(Part::Source)),
                "id" | "role" => Ok(None),
                _ => Err(()),
            },
            Part::Block { tool_result: true } => Ok((key == "content").then_some(Part::ArrayKind)),
            Part::Block { tool_result: false } => match key {
                "type" | "id" => Ok(None),
                _ => Err(()),
            },
            Part::Source => match key {
                "kind" | "provider" | "model" | "callId" => Ok(None),
                _ => Err(()),
            },
            Part::Content { .. } | Part::ArrayKind => Ok(None),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Part {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        match self {
            Part::Message { .. } | Part::Block { .. } | Part::Source => {
                deserializer.deserialize_any(ObjectVisitor(self))
            }
            Part::Content { tool_result } => {
                deserializer.deserialize_any(ContentVisitor { tool_result })
            }
            Part::ArrayKind => deserializer.deserialize_any(ArrayKindVisitor),
        }
    }
}

/// The scalar arms of a skeleton visitor that keeps a scalar as parsed.
macro_rules! keep_scalars {
    () => {
        fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
            Ok(Value::Bool(value))
        }

        fn visit_str<E>(self, value: &str) -> Result<Value, E> {
            Ok(Value::String(value.to_owned()))
        }

        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }

        fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
            Ok(Value::from(value))
        }

        fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
            Ok(Value::from(value))
        }

        fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
            Ok(Value::from(value))
        }
    };
}

/// Parses a value as a plain `Value`, except an object, whose members follow its part.
struct ObjectVisitor(Part);

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            reject_number_token(&key)?;
            let value = match self.0.member(&key) {
                Ok(Some(part)) => map.next_value_seed(part)?,
                Ok(None) => map.next_value::<Value>()?,
                Err(()) => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            members.insert(key, value);
        }
        Ok(Value::Object(members))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
    }

    keep_scalars!();
}

/// `message.content`: an array of blocks (anything else kept as parsed).
struct ContentVisitor {
    tool_result: bool,
}

impl<'de> Visitor<'de> for ContentVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut blocks = Vec::new();
        let part = Part::Block {
            tool_result: self.tool_result,
        };
        while let Some(block) = seq.next_element_seed(part)? {
            blocks.push(match self.tool_result {
                true => block,
                false => call_block_only(block),
            });
        }
        Ok(Value::Array(blocks))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        Value::deserialize(serde::de::value::MapAccessDeserializer::new(map))
    }

    keep_scalars!();
}

/// `[]` for an array (its items scanned, not built), `null` for anything else.
struct ArrayKindVisitor;

impl<'de> Visitor<'de> for ArrayKindVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Array(Vec::new()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_str<E>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// The skeleton read by a structural scan instead of a parser: one pass, in which strings
/// are skipped by searching for their closing quote and containers by counting brackets;
/// only the kept members are parsed (as `Value`s, from their own text). The payload is not
/// validated as JSON here: writers check that `data` is valid JSON (format-spec F-02-11;
/// the store refuses such an append) and every frame read back is checksummed, and on valid
/// JSON this scan finds exactly the spans a parser finds. `None` when the text is laid out in a way this scan does not read (a key
/// with an escape, a payload that is not an object, a kept member that does not parse):
/// the caller then uses [`parse`].
pub(crate) fn scan(event_type: &str, data: &str) -> Option<Skeleton> {
    let tool_result = event_type == crate::session::event::TOOL_RESULT;
    let mut cursor = Cursor { text: data, at: 0 };
    cursor.space();
    if event_type == crate::session::event::USER_MESSAGE {
        let start = cursor.at;
        let value = scan_message(&mut cursor, false)?;
        let message = cursor.text.get(start..cursor.at)?.to_owned();
        cursor.space();
        return (cursor.at == data.len()).then_some(Skeleton {
            value,
            message: Some(message),
        });
    }
    let mut members = Map::new();
    let mut message = None;
    cursor.object(|cursor, key| {
        let value = if key == "message" {
            let start = cursor.at;
            let value = scan_message(cursor, tool_result)?;
            message = Some(cursor.text.get(start..cursor.at)?);
            value
        } else if tool_result || key == "step" {
            parse_value(cursor.skip_value()?)?
        } else {
            cursor.skip_value()?;
            return Some(());
        };
        members.insert(key.to_owned(), value);
        Some(())
    })?;
    cursor.space();
    (cursor.at == data.len()).then(|| Skeleton {
        value: Value::Object(members),
        message: message.map(str::to_owned),
    })
}

fn parse_value(text: &str) -> Option<Value> {
    // Most kept members (ids, roles, kinds) are strings without escapes: their text is
    // their value, no parser needed.
    if let Some(inner) = text
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    {
        if !inner.contains(['\\', '"']) && !inner.bytes().any(|byte| byte < 0x20) {
            return Some(Value::String(inner.to_owned()));
        }
    }
    serde_json::from_str(text).ok()
}

/// [`Part::Message`] by scan, the cursor at the value.
fn scan_message(cursor: &mut Cursor<'_>, tool_result: bool) -> Option<Value> {
    scan_object(cursor, Part::Message { tool_result })
}

/// An object at `part` by scan (any other value is parsed whole), the cursor at the value.
fn scan_object(cursor: &mut Cursor<'_>, part: Part) -> Option<Value> {
    if cursor.peek() != Some(b'{') {
        return parse_value(cursor.skip_value()?);
    }
    let mut kept = Map::new();
    cursor.object(|cursor, key| {
        let value = match part.member(key) {
            Ok(Some(Part::Content { tool_result })) => scan_content(cursor, tool_result)?,
            Ok(Some(Part::ArrayKind)) => {
                let is_array = cursor.peek() == Some(b'[');
                cursor.skip_value()?;
                if is_array {
                    Value::Array(Vec::new())
                } else {
                    Value::Null
                }
            }
            Ok(Some(inner)) => scan_object(cursor, inner)?,
            Ok(None) => parse_value(cursor.skip_value()?)?,
            Err(()) => {
                cursor.skip_value()?;
                return Some(());
            }
        };
        kept.insert(key.to_owned(), value);
        Some(())
    })?;
    Some(Value::Object(kept))
}

/// [`Part::Content`] by scan, the cursor at the value.
fn scan_content(cursor: &mut Cursor<'_>, tool_result: bool) -> Option<Value> {
    if cursor.peek() != Some(b'[') {
        return parse_value(cursor.skip_value()?);
    }
    let mut blocks = Vec::new();
    cursor.array(|cursor| {
        blocks.push(match tool_result {
            true => scan_object(cursor, Part::Block { tool_result })?,
            false => scan_call_block(cursor)?,
        });
        Some(())
    })?;
    Some(Value::Array(blocks))
}

/// A user or assistant content block as the checks need it: `{type, id}` (as present) when
/// it is an object whose `type` is `"tool-call"`, else `null`. No check reads any other
/// block (the repair scan registers tool calls; the content's length is kept).
fn call_block_only(block: Value) -> Value {
    if block.get("type").and_then(Value::as_str) == Some("tool-call") {
        block
    } else {
        Value::Null
    }
}

/// [`call_block_only`] of the block at the cursor, by scan: `type` and `id` are looked at,
/// nothing is built for any other block.
fn scan_call_block(cursor: &mut Cursor<'_>) -> Option<Value> {
    if cursor.peek() != Some(b'{') {
        cursor.skip_value()?;
        return Some(Value::Null);
    }
    // (key, value text) of `type` and `id` in first-appearance order, last value winning.
    let mut kept: Vec<(&str, &str)> = Vec::with_capacity(2);
    cursor.object(|cursor, key| {
        let text = cursor.skip_value()?;
        if matches!(key, "type" | "id") {
            match kept.iter_mut().find(|(name, _)| *name == key) {
                Some(member) => member.1 = text,
                None => kept.push((key, text)),
            }
        }
        Some(())
    })?;
    let type_text = kept
        .iter()
        .find(|(name, _)| *name == "type")
        .map(|member| member.1);
    let is_call = match type_text {
        Some("\"tool-call\"") => true,
        Some(text) => parse_value(text)?.as_str() == Some("tool-call"),
        None => false,
    };
    if !is_call {
        return Some(Value::Null);
    }
    let mut members = Map::new();
    for (key, text) in kept {
        members.insert(key.to_owned(), parse_value(text)?);
    }
    Some(Value::Object(members))
}

/// A position in JSON text known to be valid.
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        self.space();
        (self.peek() == Some(byte)).then(|| self.at += 1)
    }

    /// Reads `{ "key": value, … }`: `member` is called with the cursor at each value (after
    /// its whitespace) and must consume it. `None` on a key with an escape.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.space();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Some(());
        }
        loop {
            self.space();
            if self.peek() != Some(b'"') {
                return None;
            }
            let start = self.at;
            self.at = string_end(self.text, start)?;
            let key = self.text.get(start + 1..self.at - 1)?;
            if key.contains('\\') {
                return None;
            }
            self.eat(b':')?;
            self.space();
            member(self, key)?;
            self.space();
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Reads `[ value, … ]`: `item` is called with the cursor at each value.
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        self.space();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Some(());
        }
        loop {
            self.space();
            item(self)?;
            self.space();
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Skips the value at the cursor; returns its text.
    fn skip_value(&mut self) -> Option<&'a str> {
        let start = self.at;
        let bytes = self.text.as_bytes();
        self.at = match bytes.get(start)? {
            b'"' => string_end(self.text, start)?,
            b'{' | b'[' => container_end(self.text, start)?,
            _ => {
                let length = bytes[start..]
                    .iter()
                    .position(|byte| {
                        matches!(byte, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                    })
                    .unwrap_or(bytes.len() - start);
                if length == 0 {
                    return None;
                }
                start + length
            }
        };
        self.text.get(start..self.at)
    }
}

/// Index just past the string whose opening quote is at `at`: the first quote after it
/// preceded by an even number of backslashes.
fn string_end(text: &str, at: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    // Every search starts just past an ASCII quote, so on a character boundary.
    let mut from = at + 1;
    loop {
        let quote = from + text.get(from..)?.find('"')?;
        let backslashes = bytes[from..quote]
            .iter()
            .rev()
            .take_while(|byte| **byte == b'\\')
            .count();
        if backslashes % 2 == 0 {
            return Some(quote + 1);
        }
        from = quote + 1;
    }
}

/// Index just past the object or array opening at `at`.
fn container_end(text: &str, at: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut position = at;
    while let Some(byte) = bytes.get(position) {
        match byte {
            b'"' => {
                position = string_end(text, position)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(position + 1);
                }
            }
            _ => {}
        }
        position += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    type Read = Option<(Value, Option<String>)>;

    /// The skeleton by scan and by parser.
    fn both(event_type: &str, data: &str) -> (Read, Read) {
        let pair = |skeleton: Skeleton| (skeleton.value, skeleton.message);
        (
            scan(event_type, data).map(pair),
            parse(event_type, data).map(pair),
        )
    }

    #[test]
    fn the_scan_reads_what_the_parser_reads() {
        let message = r#"{"role":"assistant","content":[{"type":"text","text":"a \"quoted\" [brace} \\"},{"type":"tool-call","id":"c1","name":"x","arguments":"{\"a\":[1,{}]}"},7],"source":{"kind":"model","provider":"p","model":"m","replayState":{"x":"\\\""}},"id":"a1","extra":1.50}"#;
        let cases = [
            ("assistant/message", format!(r#"{{"turn":1,"step":2,"message":{message}}}"#)),
            ("assistant/message", format!(" {{ \"step\" : 2 ,\n\"message\" :\t{message} , \"step\":3 }} ")),
            ("user/message", r#" {"content":[{"type":"text","text":"\\\\"}],"source":{"kind":"user"},"role":"user","id":"u","id":"v"} "#.to_owned()),
            ("user/message", r#"{"content":"not an array","source":null,"role":"user","id":"u"}"#.to_owned()),
            ("tool/result", r#"{"turn":1,"step":1,"message":{"source":{"kind":"tool","callId":"c"},"content":[{"type":"tool-result","toolCallId":"c","content":[{"type":"text","text":"\"]}"}],"isError":false}],"role":"user","id":"r"},"error":{"n":[1e5,-0]},"meta":"é"}"#.to_owned()),
            ("tool/result", r#"{"message":{"content":[{"type":"tool-result","content":"x"},{"content":[]}]},"message":{"id":"second"}}"#.to_owned()),
            ("tool/result", r#"{"turn":1}"#.to_owned()),
            ("assistant/message", r#"{"message":{"content":[{"type":"tool\u002dcall","id":"x","id":"y"},{"id":"z","type":"tool-call","type":"text"},"s",{"type":"tool-call"}],"id":"a"}}"#.to_owned()),
            ("assistant/message", r#"{"message":{"content":[],"id":"a","role":"assistant","source":{"kind":"model"}}}"#.to_owned()),
            ("user/message", "{\"id\":\"tab\\there\",\"role\":\"us\u{e9}r\",\"source\":{\"kind\":\"\"},\"content\":[]}".to_owned()),
        ];
        for (event_type, data) in cases {
            let (scanned, parsed) = both(event_type, &data);
            assert!(scanned.is_some(), "{event_type} {data}");
            assert_eq!(scanned, parsed, "{event_type} {data}");
        }
    }

    #[test]
    fn the_scan_declines_what_it_does_not_read() {
        for (event_type, data) in [
            ("assistant/message", r#"{"mess\u0061ge":{}}"#),
            ("tool/result", r#"[1,2]"#),
            ("assistant/message", r#"{"message":{"id":"\ud800"}}"#),
        ] {
            assert!(scan(event_type, data).is_none(), "{data}");
        }
    }
}
