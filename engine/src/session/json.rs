//! Lossless JSON helpers.
//!
//! Event payloads are kept as their exact JSON text (`RawValue`), never re-serialized, so
//! number spellings (`1.0`, `1e400`), escapes and lone UTF-16 surrogates (`"\ud800"`, valid
//! DSH data) survive. `RawValue` parsing tolerates lone surrogates; parsing into `String` or
//! `Value` does not. So:
//! - structural reads (message ids, shapes, tool-call ids) go through [`value_lossy`], which
//!   maps each lone surrogate escape to U+FFFD before parsing: good enough for decisions
//!   (no DSH rule inspects surrogates) and documented as lossy;
//! - text that must stay exact (derived messages, migrated payloads) is sliced or spliced
//!   from the original member texts by [`object_members`] and [`ObjectText`].

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;
use std::fmt;

/// Largest integer a JS double holds exactly (`Number.MAX_SAFE_INTEGER`).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// The JS value of a JSON number text (what `JSON.parse` yields), `None` if it is not a number.
pub fn js_number(text: &str) -> Option<f64> {
    let text = text.trim();
    let first = text.as_bytes().first()?;
    if *first != b'-' && !first.is_ascii_digit() {
        return None;
    }
    text.parse::<f64>().ok()
}

/// `Number.isSafeInteger` over a JSON number text; `-0` counts as 0, as in JS.
pub fn js_safe_integer(text: &str) -> Option<i64> {
    let number = js_number(text)?;
    let in_range = number.abs() <= MAX_SAFE_INTEGER as f64;
    (number.is_finite() && number.fract() == 0.0 && in_range).then_some(number as i64)
}

/// Whether every number in `text` is a JS double DSH's `snapshotJsonValue` accepts: finite
/// (`1e400` parses to Infinity) and not `-0` (including `-0.0` and underflows like `-1e-400`).
pub fn is_lossless(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut position = 0;
    while position < bytes.len() {
        match bytes[position] {
            b'"' => position = skip_string(bytes, position),
            byte if byte == b'-' || byte.is_ascii_digit() => {
                let end = number_end(bytes, position);
                if !number_is_lossless(&text[position..end]) {
                    return false;
                }
                position = end;
            }
            _ => position += 1,
        }
    }
    true
}

fn number_is_lossless(number_text: &str) -> bool {
    match number_text.parse::<f64>() {
        Ok(number) => number.is_finite() && !(number == 0.0 && number.is_sign_negative()),
        Err(_) => false,
    }
}

fn number_end(bytes: &[u8], start: usize) -> usize {
    let mut end = start;
    while end < bytes.len() && matches!(bytes[end], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
    {
        end += 1;
    }
    end
}

/// Index just past the string literal opening at `start`.
fn skip_string(bytes: &[u8], start: usize) -> usize {
    let mut position = start + 1;
    while position < bytes.len() {
        match bytes[position] {
            b'\\' => position += 2,
            b'"' => return position + 1,
            _ => position += 1,
        }
    }
    position
}

/// Parses JSON text into a `Value`, replacing lone surrogate escapes by U+FFFD (see module doc).
pub fn value_lossy(text: &str) -> Result<Value, serde_json::Error> {
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(error) if text.contains("\\u") => {
            serde_json::from_str(&replace_lone_surrogates(text)).map_err(|_| error)
        }
        Err(error) => Err(error),
    }
}

fn replace_lone_surrogates(text: &str) -> String {
    let mut output = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("\\u") {
        let backslashes = rest[..at]
            .bytes()
            .rev()
            .take_while(|byte| *byte == b'\\')
            .count();
        output.push_str(&rest[..at]);
        let escape = &rest[at..];
        if backslashes % 2 == 1 {
            // `\\u` is an escaped backslash followed by a literal `u`, not a unicode escape.
            output.push_str("\\u");
            rest = &escape[2..];
            continue;
        }
        let unit = hex_unit(escape);
        let pair_low = hex_unit(escape.get(6..).unwrap_or(""));
        let consumed = match unit {
            Some(high @ 0xD800..=0xDBFF) if matches!(pair_low, Some(0xDC00..=0xDFFF)) => {
                output.push_str(&escape[..12]);
                let _ = high;
                12
            }
            Some(0xD800..=0xDFFF) => {
                output.push_str("\\ufffd");
                6
            }
            _ => {
                output.push_str("\\u");
                2
            }
        };
        rest = &escape[consumed..];
    }
    output.push_str(rest);
    output
}

/// The code unit of a `\uXXXX` escape at the start of `text`.
fn hex_unit(text: &str) -> Option<u32> {
    let digits = text.strip_prefix("\\u")?.get(..4)?;
    u32::from_str_radix(digits, 16).ok()
}

/// The members of a JSON object text, in first-appearance order with the last duplicate's
/// value (JS `JSON.parse` semantics). `None` if the text is not an object.
pub fn object_members(text: &str) -> Option<Vec<(String, Box<RawValue>)>> {
    serde_json::from_str::<ObjectMembers>(text)
        .ok()
        .map(|members| members.0)
}

/// [`object_members`] with every value borrowed from `text`: the same acceptance, order
/// and duplicate rule, without a copy of each value. A packed row's line is mostly its
/// `data` member, which the import otherwise copies twice (the line's members, then
/// `data`'s) before it reads the payloads.
pub fn object_members_borrowed(text: &str) -> Option<Vec<(String, &RawValue)>> {
    object_members_as_written(text).map(resolve_duplicates)
}

/// Every member of an object text as it stands, duplicates included, values borrowed:
/// the one parse [`object_members_borrowed`] makes, for a reader that must also know
/// whether a key repeats.
pub fn object_members_as_written(text: &str) -> Option<Vec<(String, &RawValue)>> {
    serde_json::from_str::<BorrowedMembers<'_>>(text)
        .ok()
        .map(|members| members.0)
}

/// The members of [`object_members_as_written`] as [`object_members_borrowed`] gives them.
pub fn resolve_duplicates(every: Vec<(String, &RawValue)>) -> Vec<(String, &RawValue)> {
    // First-appearance order, the last duplicate's value (what the owned reading keeps).
    let mut members: Vec<(String, &RawValue)> = Vec::with_capacity(every.len());
    for (key, value) in every {
        match members.iter_mut().find(|(name, _)| *name == key) {
            Some(existing) => existing.1 = value,
            None => members.push((key, value)),
        }
    }
    members
}

/// The raw text of member `key` of an object text (last duplicate wins).
pub fn member<'text>(text: &'text str, key: &str) -> Option<&'text RawValue> {
    serde_json::from_str::<BorrowedMembers<'text>>(text)
        .ok()?
        .0
        .into_iter()
        .rev()
        .find(|(name, _)| name == key)
        .map(|(_, value)| value)
}

/// The keys of a JSON object text, in order, accepting exactly what reading it as a
/// `serde_json::Map<String, Value>` accepts (every string, key or value, is checked as a
/// string is, so a lone surrogate escape is refused the same way) without building any
/// value: an event's envelope can cite thousands of seqs, and each number as a `Value`
/// (arbitrary precision) costs an allocation. Duplicate keys are listed as often as they
/// stand. An object in the plain form (`plain_json::plain_object_keys`) is read without
/// serde: an envelope's `sourceEventSeqs` cites thousands of seqs.
pub fn object_keys(text: &str) -> Result<Vec<String>, serde_json::Error> {
    if let Some(keys) = super::plain_json::plain_object_keys(text) {
        return Ok(keys);
    }
    serde_json::from_str::<ObjectKeys>(text).map(|keys| keys.0)
}

struct ObjectKeys(Vec<String>);

impl<'de> Deserialize<'de> for ObjectKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeysVisitor;
        impl<'de> Visitor<'de> for KeysVisitor {
            type Value = ObjectKeys;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ObjectKeys, A::Error> {
                let mut keys = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<CheckedJson>()?;
                    keys.push(key);
                }
                Ok(ObjectKeys(keys))
            }
        }
        deserializer.deserialize_map(KeysVisitor)
    }
}

/// Any JSON value, read with `Value`'s acceptance and dropped as it is read.
struct CheckedJson;

impl<'de> Deserialize<'de> for CheckedJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CheckedJsonVisitor)
    }
}

struct CheckedJsonVisitor;

impl<'de> Visitor<'de> for CheckedJsonVisitor {
    type Value = CheckedJson;
    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any valid JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<CheckedJson, E> {
        Ok(CheckedJson)
    }
    fn visit_i64<E>(self, _: i64) -> Result<CheckedJson, E> {
        Ok(CheckedJson)
    }
    fn visit_u64<E>(self, _: u64) -> Result<CheckedJson, E> {
        Ok(CheckedJson)
    }
    fn visit_f64<E>(self, _: f64) -> Result<CheckedJson, E> {
        Ok(CheckedJson)
    }
    fn visit_str<E>(self, _: &str) -> Result<CheckedJson, E> {
        Ok(CheckedJson)
    }
    fn visit_unit<E>(self) -> Result<CheckedJson, E> {
        Ok(CheckedJson)
    }
    fn visit_none<E>(self) -> Result<CheckedJson, E> {
        Ok(CheckedJson)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<CheckedJson, D::Error> {
        CheckedJson::deserialize(deserializer)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<CheckedJson, A::Error> {
        while seq.next_element::<CheckedJson>()?.is_some() {}
        Ok(CheckedJson)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CheckedJson, A::Error> {
        // Keys are strings; as map keys they reach `visit_str`. With arbitrary precision a
        // number arrives here too, as a one-member map holding its text.
        while map.next_key::<CheckedJson>()?.is_some() {
            map.next_value::<CheckedJson>()?;
        }
        Ok(CheckedJson)
    }
}

struct ObjectMembers(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for ObjectMembers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = ObjectMembers;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ObjectMembers, A::Error> {
                let mut members: Vec<(String, Box<RawValue>)> = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value = map.next_value::<Box<RawValue>>()?;
                    match members.iter_mut().find(|(name, _)| *name == key) {
                        Some(existing) => existing.1 = value,
                        None => members.push((key, value)),
                    }
                }
                Ok(ObjectMembers(members))
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

struct BorrowedMembers<'text>(Vec<(String, &'text RawValue)>);

impl<'de: 'text, 'text> Deserialize<'de> for BorrowedMembers<'text> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor<'text>(std::marker::PhantomData<&'text ()>);
        impl<'de: 'text, 'text> Visitor<'de> for MembersVisitor<'text> {
            type Value = BorrowedMembers<'text>;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    members.push((key, map.next_value::<&'de RawValue>()?));
                }
                Ok(BorrowedMembers(members))
            }
        }
        deserializer.deserialize_map(MembersVisitor(std::marker::PhantomData))
    }
}

/// Builds compact object text (`JSON.stringify` layout) from member texts, in call order.
#[derive(Default)]
pub struct ObjectText {
    text: String,
}

impl ObjectText {
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty object text with room for about `bytes` bytes: a migrated payload is
    /// rebuilt from its members, and growing it by doubling copies it again and again.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            text: String::with_capacity(bytes),
        }
    }

    /// Appends a member whose value is already JSON text.
    pub fn raw(mut self, key: &str, value_text: &str) -> Self {
        self.text.push(if self.text.is_empty() { '{' } else { ',' });
        self.text.push_str(&string_text(key));
        self.text.push(':');
        self.text.push_str(value_text);
        self
    }

    /// Appends a string member.
    pub fn string(self, key: &str, value: &str) -> Self {
        let value_text = string_text(value);
        self.raw(key, &value_text)
    }

    pub fn finish(self) -> String {
        if self.text.is_empty() {
            "{}".to_owned()
        } else {
            self.text + "}"
        }
    }
}

/// `JSON.stringify` of a string (serde_json escapes exactly what JS escapes for valid UTF-8).
pub fn string_text(value: &str) -> String {
    // Nothing to escape (the usual key or id): the text is the value quoted, without a
    // `Value` built and serialized for it.
    if value.bytes().all(super::plain_json::is_plain_string_byte) {
        let mut text = String::with_capacity(value.len() + 2);
        text.push('"');
        text.push_str(value);
        text.push('"');
        return text;
    }
    serde_json::Value::String(value.to_owned()).to_string()
}

/// Wraps text produced by this module's builders, which is valid JSON by construction.
pub fn raw_from_built(text: String) -> Box<RawValue> {
    RawValue::from_string(text).unwrap_or_else(|_| null_raw())
}

pub fn null_raw() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).unwrap_or_else(|_| unreachable!("null is JSON"))
}

/// DSH's `isDeepEqualJson`: structural, key-order-insensitive, key-count-sensitive; numbers
/// compare as JS doubles (so `1.0` equals `1`).
pub fn json_equal(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(a), Value::Number(b)) => {
            js_number(&a.to_string()) == js_number(&b.to_string())
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| json_equal(x, y))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(key, x)| b.get(key).is_some_and(|y| json_equal(x, y)))
        }
        _ => left == right,
    }
}

/// A serde_json error about one line of a JSON-lines file, for a message that already names
/// the line: serde counts lines within the text it was given (always `line 1` here), so its
/// position is restated as the column alone (`expected value at column 1`, not `line 2:
/// expected value at line 1 column 1`).
pub fn single_line_error(error: &serde_json::Error) -> String {
    let text = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    match text.strip_suffix(&position) {
        Some(message) if error.line() == 1 => format!("{message} at column {}", error.column()),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lossless_rejects_negative_zero_and_overflow_only_outside_strings() {
        assert!(is_lossless(r#"{"a":[1,0.5,1e21,"-0"],"b":"1e400"}"#));
        for text in ["-0", "[-0.0]", r#"{"x":1e400}"#, "-1e400", "-1e-400"] {
            assert!(!is_lossless(text), "{text}");
        }
        assert!(is_lossless(r#""\"-0""#));
    }

    #[test]
    fn lossy_value_survives_lone_surrogates_but_keeps_pairs() {
        let value = value_lossy(r#"["\ud800","\ud83d\ude00","\\ud800","\udc00\ud800"]"#);
        let expected = serde_json::json!(["\u{fffd}", "\u{1f600}", "\\ud800", "\u{fffd}\u{fffd}"]);
        assert_eq!(value.ok(), Some(expected));
    }

    #[test]
    fn members_resolve_duplicates_last_wins_at_first_position() {
        let members = object_members(r#"{"a":1,"b":"\ud800","a":3}"#).unwrap_or_default();
        let rendered: Vec<(String, String)> = members
            .iter()
            .map(|(key, value)| (key.clone(), value.get().to_owned()))
            .collect();
        let expected = vec![
            ("a".to_owned(), "3".to_owned()),
            ("b".to_owned(), r#""\ud800""#.to_owned()),
        ];
        assert_eq!(rendered, expected);
        assert_eq!(
            member(r#"{"m":1,"m":{"x":2}}"#, "m").map(RawValue::get),
            Some(r#"{"x":2}"#)
        );
    }

    #[test]
    fn safe_integers_follow_js() {
        assert_eq!(js_safe_integer("1.0"), Some(1));
        assert_eq!(js_safe_integer("1.79e12"), Some(1_790_000_000_000));
        assert_eq!(js_safe_integer("-0"), Some(0));
        assert_eq!(js_safe_integer("0.5"), None);
        assert_eq!(js_safe_integer("9007199254740992"), None);
        assert_eq!(js_safe_integer("\"1\""), None);
    }

    #[test]
    fn deep_equality_is_order_insensitive_and_numeric() {
        let left = serde_json::from_str::<Value>(r#"{"a":1.0,"b":[1,{"c":null}]}"#).ok();
        let right = serde_json::from_str::<Value>(r#"{"b":[1,{"c":null}],"a":1}"#).ok();
        let (Some(left), Some(right)) = (left, right) else {
            panic!("fixture JSON")
        };
        assert!(json_equal(&left, &right));
        assert!(!json_equal(&left, &serde_json::json!({"a": 1})));
    }

    /// The quoted text of a string with nothing to escape is serde's text.
    #[test]
    fn string_text_is_serdes_text() {
        for value in [
            "",
            "id",
            "legacy-message:s:1",
            "a\"b",
            "a\\b",
            "tab\t",
            "\u{7f}\u{e9}\u{2028}",
            "\u{1}",
        ] {
            let serde = serde_json::Value::String(value.to_owned()).to_string();
            assert_eq!(string_text(value), serde, "{value:?}");
        }
    }

    #[test]
    fn single_line_errors_give_the_column_only() {
        let error = serde_json::from_str::<serde_json::Value>(" x").expect_err("not JSON");
        assert_eq!(single_line_error(&error), "expected value at column 2");
        // Several lines: serde's own line number is meaningful and stays.
        let error = serde_json::from_str::<serde_json::Value>("[\n x]").expect_err("not JSON");
        assert_eq!(single_line_error(&error), error.to_string());
    }

    /// `object_keys` accepts and refuses exactly what reading a `Map<String, Value>` does,
    /// with the same error text, and lists the keys in order.
    #[test]
    fn object_keys_accepts_what_a_value_map_accepts() {
        let deep =
            |levels: usize| format!("{{\"a\":{}1{}}}", "[".repeat(levels), "]".repeat(levels));
        let cases = [
            r#"{"a":1,"b":[1e400,-0,"x"],"a":{"c":null}}"#.to_owned(),
            r#"{"sourceEventSeqs":[1,2,3],"surfaceOp":"append"}"#.to_owned(),
            r#"{"lone":"\ud800"}"#.to_owned(),
            r#"{"\udc00":1}"#.to_owned(),
            r#"{"pair":"\ud83d\ude00","nested":{"k":["\ud800"]}}"#.to_owned(),
            r#"{"a":"tab	in string"}"#.to_owned(),
            r#"{"n":123456789012345678901234567890}"#.to_owned(),
            r#"[1,2]"#.to_owned(),
            r#"{"a":1,}"#.to_owned(),
            r#"{}"#.to_owned(),
            deep(120),
            deep(127),
            deep(200),
        ];
        let mut refused = 0;
        for text in &cases {
            let expected = serde_json::from_str::<serde_json::Map<String, Value>>(text);
            refused += usize::from(expected.is_err());
            let keys = object_keys(text);
            match (&expected, &keys) {
                (Ok(map), Ok(keys)) => {
                    let mut unique: Vec<&String> = Vec::new();
                    for key in keys {
                        if !unique.contains(&key) {
                            unique.push(key);
                        }
                    }
                    assert_eq!(unique, map.keys().collect::<Vec<_>>(), "{text}");
                }
                (Err(expected), Err(error)) => {
                    assert_eq!(error.to_string(), expected.to_string(), "{text}")
                }
                _ => panic!("{text}: Map<String, Value> gives {expected:?}, object_keys {keys:?}"),
            }
        }
        // Lone surrogates (a value, a key, a nested value), the control character, the
        // array, the trailing comma and the nesting past serde_json's recursion limit.
        assert_eq!(refused, 8);
    }

    #[test]
    fn borrowed_members_are_the_owned_members_without_the_copies() {
        let texts = [
            r#"{"a":1,"b":"\ud800","a":3}"#,
            r#"{"type":"text-chunks","seq0":4,"time0":-1,"data":{"turn":1,"texts":["x"]}}"#,
            r#"{"k\u0061":[1,{"k":2}],"ka":null}"#,
            r#" {"a" : 1 } "#,
            r#"{"a":1,}"#,
            r#"{"a":1} x"#,
            r#"[1,2]"#,
            r#""text""#,
            r#"{"a":"\x"}"#,
            "{\"a\":\"\u{1}\"}",
            "",
        ];
        for text in texts {
            let owned = object_members(text).map(|members| {
                members
                    .into_iter()
                    .map(|(key, value)| (key, value.get().to_owned()))
                    .collect::<Vec<_>>()
            });
            let borrowed = object_members_borrowed(text).map(|members| {
                members
                    .into_iter()
                    .map(|(key, value)| (key, value.get().to_owned()))
                    .collect::<Vec<_>>()
            });
            assert_eq!(owned, borrowed, "{text}");
        }
        assert_eq!(
            object_members_borrowed(r#"{"a":1,"b":2,"a":3}"#).map(|members| members.len()),
            Some(2)
        );
    }
}
