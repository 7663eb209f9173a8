//! Readers of JSON texts in the plain form DSH and dshdb write (no whitespace, integers as
//! `itoa` prints them, strings without escapes) that give the answer of a serde reading
//! without a serde pass, or `None` for any other text, which the caller then reads with
//! serde. An import reads a `sourceEventSeqs` list of thousands of seqs and checks its
//! envelope's keys more than once; serde spends an allocation or a `Value` per number.

use super::json::MAX_SAFE_INTEGER;

/// Longest integer text read here: a safe integer's 16 digits and a sign.
pub const MAX_CANONICAL_INTEGER_BYTES: usize = 17;

/// Splits an integer off the front of `text` when it is the text `itoa` writes for a safe
/// integer (no leading zero, no `-0`, no fraction or exponent), with its value; `None`
/// otherwise (what follows the digits is the caller's to check).
pub fn split_canonical_integer(text: &str) -> Option<(i64, &str)> {
    let bytes = text.as_bytes();
    let negative = bytes.first() == Some(&b'-');
    let sign = usize::from(negative);
    // One pass over the digits: a row's `dt` and a message's `sourceEventSeqs` are
    // thousands of short integers.
    let mut magnitude: u64 = 0;
    let mut end = sign;
    while let Some(digit) = bytes.get(end).filter(|byte| byte.is_ascii_digit()) {
        if end == MAX_CANONICAL_INTEGER_BYTES {
            return None;
        }
        magnitude = magnitude * 10 + u64::from(digit - b'0');
        end += 1;
    }
    let digits = end - sign;
    let leading_zero = bytes.get(sign) == Some(&b'0') && (digits > 1 || negative);
    if digits == 0 || leading_zero || magnitude > MAX_SAFE_INTEGER {
        return None;
    }
    let magnitude = i64::try_from(magnitude).ok()?;
    let value = if negative { -magnitude } else { magnitude };
    Some((value, &text[end..]))
}

/// A list of non-negative safe integers written plainly (`[]`, `[0,4,17]`), as its values:
/// what reading it as an array of numbers, each a non-negative safe integer, gives.
pub fn canonical_seq_list(text: &str) -> Option<Vec<u64>> {
    let mut rest = text.strip_prefix('[')?;
    let mut seqs = Vec::new();
    if rest == "]" {
        return Some(seqs);
    }
    loop {
        let (value, after) = split_canonical_integer(rest)?;
        seqs.push(u64::try_from(value).ok()?);
        match after.as_bytes().first()? {
            b',' => rest = &after[1..],
            b']' if after.len() == 1 => return Some(seqs),
            _ => return None,
        }
    }
}

/// The keys of an object text whose keys and values are plain: each key a string without
/// escapes; each value such a string, `true`, `false`, `null`, an integer or a list of
/// integers (as [`split_canonical_integer`] reads them). What `json::object_keys` gives
/// for it (duplicates listed as they stand); `None` for any other text.
pub fn plain_object_keys(text: &str) -> Option<Vec<String>> {
    let mut rest = text.strip_prefix('{')?;
    let mut keys = Vec::new();
    if rest == "}" {
        return Some(keys);
    }
    loop {
        let (key, after) = split_plain_string(rest)?;
        keys.push(key.to_owned());
        let after = skip_plain_value(after.strip_prefix(':')?)?;
        match after.as_bytes().first()? {
            b',' => rest = &after[1..],
            b'}' if after.len() == 1 => return Some(keys),
            _ => return None,
        }
    }
}

/// Splits a string token without escapes or control characters off the front of `text`:
/// its content, and the rest after the closing quote.
pub fn split_plain_string(text: &str) -> Option<(&str, &str)> {
    let body = text.strip_prefix('"')?;
    let end = memchr::memchr2(b'"', b'\\', body.as_bytes())?;
    let content = &body[..end];
    let plain = body.as_bytes()[end] == b'"' && content.bytes().all(is_plain_string_byte);
    plain.then(|| (content, &body[end + 1..]))
}

/// Whether a string's byte stands for itself in every JSON reading and writing: not a
/// control character, a quote or a backslash.
pub fn is_plain_string_byte(byte: u8) -> bool {
    byte >= 0x20 && byte != b'"' && byte != b'\\'
}

/// The rest of `text` after one plain value ([`plain_object_keys`]).
fn skip_plain_value(text: &str) -> Option<&str> {
    match text.as_bytes().first()? {
        b'"' => split_plain_string(text).map(|(_, rest)| rest),
        b't' => text.strip_prefix("true"),
        b'f' => text.strip_prefix("false"),
        b'n' => text.strip_prefix("null"),
        b'[' => skip_integer_list(text),
        _ => split_canonical_integer(text).map(|(_, rest)| rest),
    }
}

/// The rest of `text` after a list of integers (`[]`, `[1,-2,3]`).
fn skip_integer_list(text: &str) -> Option<&str> {
    let mut rest = text.strip_prefix('[')?;
    if let Some(after) = rest.strip_prefix(']') {
        return Some(after);
    }
    loop {
        let (_, after) = split_canonical_integer(rest)?;
        match after.as_bytes().first()? {
            b',' => rest = &after[1..],
            b']' => return Some(&after[1..]),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::json::{js_safe_integer, object_keys};
    use super::*;

    /// Each plain reading against the serde one, on texts it reads and texts it leaves.
    #[test]
    fn plain_readings_agree_with_serde() {
        let integers = [
            "0",
            "7",
            "-3",
            "10",
            "01",
            "-0",
            "1.0",
            "1e2",
            "+1",
            "-",
            "",
            "9007199254740991",
            "9007199254740992",
            "-9007199254740991",
            "12345678901234567",
        ];
        for text in integers {
            // What follows the integer (`.0`, `e2`) is the caller's to check.
            if let Some((value, rest)) = split_canonical_integer(text) {
                let integer = &text[..text.len() - rest.len()];
                assert!(!rest.starts_with(|c: char| c.is_ascii_digit()), "{text}");
                assert_eq!(js_safe_integer(integer), Some(value), "{text}");
                assert_eq!(value.to_string(), integer, "{text}");
            }
        }
        let lists = [
            "[]",
            "[0]",
            "[1,2,3]",
            "[1, 2]",
            "[01]",
            "[-1]",
            "[1,]",
            "[,1]",
            "[1]]",
            "[1.5]",
            "[9007199254740991]",
            "[9007199254740992]",
            "[1,2",
            "[\"1\"]",
        ];
        for text in lists {
            let serde: Option<Vec<u64>> = serde_json::from_str::<Vec<serde_json::Value>>(text)
                .ok()
                .and_then(|items| {
                    items
                        .iter()
                        .map(|item| js_safe_integer(&item.to_string()))
                        .map(|value| value.and_then(|value| u64::try_from(value).ok()))
                        .collect()
                });
            if let Some(plain) = canonical_seq_list(text) {
                assert_eq!(Some(plain), serde, "{text}");
            }
        }
        let objects = [
            "{}",
            r#"{"sourceEventSeqs":[1,2,3],"surfaceOp":"append"}"#,
            r#"{"a":true,"b":false,"c":null,"d":-4,"e":"x y","a":[]}"#,
            r#"{"a":"\u0041"}"#,
            r#"{"a\"":1}"#,
            r#"{"a":1 }"#,
            r#"{"a":{"b":1}}"#,
            r#"{"a":[1,"b"]}"#,
            r#"{"a":01}"#,
            r#"{"a":1}}"#,
            r#"{"a":1,}"#,
            "{\"a\":\"\u{1}\"}",
            r#"{"a":tru}"#,
        ];
        let mut read = 0;
        for text in objects {
            if let Some(keys) = plain_object_keys(text) {
                read += 1;
                assert_eq!(Some(keys), object_keys(text).ok(), "{text}");
            }
        }
        assert_eq!(read, 3);
    }
}
