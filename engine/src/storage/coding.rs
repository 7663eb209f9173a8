//! The one checked little-endian reader and writer of the store's binary formats (frames,
//! segment and run headers, the manifest, the index checkpoint, cache and spill files), and
//! the one parser of `<16 lower-hex digits>.<extension>` file names (segments, runs).
//!
//! Pure: no I/O. A read past the end is a typed [`ShortInput`] naming the field, never a
//! panic; a length or count that does not fit its field is [`Error::TooLarge`] naming the
//! field, the value and the limit, never a silently clamped or wrapped number.

use crate::error::{Error, Result};

/// A read needed more bytes than were left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{field} needs {needed} bytes at offset {offset}; {available} are left")]
pub struct ShortInput {
    /// The field being read.
    pub field: &'static str,
    /// Where it starts, in bytes from the start of the input.
    pub offset: usize,
    /// Bytes it needs.
    pub needed: usize,
    /// Bytes that were left.
    pub available: usize,
}

/// For decoders whose errors are reasons (derived files that are ignored when damaged).
impl From<ShortInput> for String {
    fn from(short: ShortInput) -> Self {
        short.to_string()
    }
}

/// Reads little-endian fields off a byte slice, front to back; every read is bounds-checked.
#[derive(Debug, Clone)]
pub struct Reader<'bytes> {
    bytes: &'bytes [u8],
    position: usize,
}

impl<'bytes> Reader<'bytes> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'bytes [u8]) -> Self {
        Self::at(bytes, 0)
    }

    /// A reader at `position` of `bytes` (past the end, every read fails).
    pub fn at(bytes: &'bytes [u8], position: usize) -> Self {
        Self { bytes, position }
    }

    /// Bytes read so far, counted from the start of the input.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Bytes left to read.
    pub fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.position)
    }

    /// Whether every byte has been read.
    pub fn is_at_end(&self) -> bool {
        self.remaining() == 0
    }

    /// The next `length` bytes.
    pub fn bytes(
        &mut self,
        length: usize,
        field: &'static str,
    ) -> std::result::Result<&'bytes [u8], ShortInput> {
        let short = ShortInput {
            field,
            offset: self.position,
            needed: length,
            available: self.remaining(),
        };
        let end = self
            .position
            .checked_add(length)
            .filter(|end| *end <= self.bytes.len())
            .ok_or(short)?;
        let slice = &self.bytes[self.position..end];
        self.position = end;
        Ok(slice)
    }

    /// Every byte left.
    pub fn rest(&mut self) -> &'bytes [u8] {
        let start = self.position.min(self.bytes.len());
        self.position = self.bytes.len();
        &self.bytes[start..]
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(
        &mut self,
        field: &'static str,
    ) -> std::result::Result<[u8; N], ShortInput> {
        let mut array = [0; N];
        array.copy_from_slice(self.bytes(N, field)?);
        Ok(array)
    }

    pub fn u8(&mut self, field: &'static str) -> std::result::Result<u8, ShortInput> {
        Ok(self.array::<1>(field)?[0])
    }

    pub fn u16(&mut self, field: &'static str) -> std::result::Result<u16, ShortInput> {
        self.array(field).map(u16::from_le_bytes)
    }

    pub fn u32(&mut self, field: &'static str) -> std::result::Result<u32, ShortInput> {
        self.array(field).map(u32::from_le_bytes)
    }

    pub fn u64(&mut self, field: &'static str) -> std::result::Result<u64, ShortInput> {
        self.array(field).map(u64::from_le_bytes)
    }

    pub fn i64(&mut self, field: &'static str) -> std::result::Result<i64, ShortInput> {
        self.array(field).map(i64::from_le_bytes)
    }
}

/// The little-endian `u32` at `offset` of `bytes` (a fixed-layout field).
pub fn u32_at(
    bytes: &[u8],
    offset: usize,
    field: &'static str,
) -> std::result::Result<u32, ShortInput> {
    Reader::at(bytes, offset).u32(field)
}

/// The little-endian `u64` at `offset` of `bytes` (a fixed-layout field).
pub fn u64_at(
    bytes: &[u8],
    offset: usize,
    field: &'static str,
) -> std::result::Result<u64, ShortInput> {
    Reader::at(bytes, offset).u64(field)
}

/// Appends little-endian fields to a byte vector.
#[derive(Debug)]
pub struct Writer<'out> {
    out: &'out mut Vec<u8>,
}

impl<'out> Writer<'out> {
    /// A writer appending to `out`.
    pub fn new(out: &'out mut Vec<u8>) -> Self {
        Self { out }
    }

    pub fn u8(&mut self, value: u8) -> &mut Self {
        self.out.push(value);
        self
    }

    pub fn u16(&mut self, value: u16) -> &mut Self {
        self.bytes(&value.to_le_bytes())
    }

    pub fn u32(&mut self, value: u32) -> &mut Self {
        self.bytes(&value.to_le_bytes())
    }

    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.bytes(&value.to_le_bytes())
    }

    pub fn i64(&mut self, value: i64) -> &mut Self {
        self.bytes(&value.to_le_bytes())
    }

    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        self.out.extend_from_slice(bytes);
        self
    }

    /// Writes a length or count as a `u16` field; one that does not fit is `TooLarge`.
    pub fn u16_length(&mut self, length: usize, field: &'static str) -> Result<&mut Self> {
        Ok(self.u16(checked_u16(length, field)?))
    }

    /// Writes a length or count as a `u32` field; one that does not fit is `TooLarge`.
    pub fn u32_length(&mut self, length: usize, field: &'static str) -> Result<&mut Self> {
        Ok(self.u32(checked_u32(length, field)?))
    }

    /// Writes a length or count as a `u64` field (every `usize` fits one).
    pub fn u64_length(&mut self, length: usize) -> &mut Self {
        self.u64(widen(length))
    }
}

/// A byte length as a `u16` field, or `TooLarge` naming the field.
pub fn checked_u16(length: usize, field: &'static str) -> Result<u16> {
    u16::try_from(length).map_err(|_| too_large(field, length, u64::from(u16::MAX), "bytes"))
}

/// A byte length as a `u32` field, or `TooLarge` naming the field.
pub fn checked_u32(length: usize, field: &'static str) -> Result<u32> {
    u32::try_from(length).map_err(|_| too_large(field, length, u64::from(u32::MAX), "bytes"))
}

/// A count of `unit` (`events`, `entries`, ...) as a `u32` field, or `TooLarge` naming the
/// field.
pub fn checked_count_u32(count: usize, field: &'static str, unit: &'static str) -> Result<u32> {
    u32::try_from(count).map_err(|_| too_large(field, count, u64::from(u32::MAX), unit))
}

/// A stored `u64` offset or length as an in-memory `usize`, or `TooLarge` naming the field
/// (only on a target whose `usize` is narrower than the value).
pub fn checked_usize(value: u64, field: &'static str) -> Result<usize> {
    usize::try_from(value).map_err(|_| Error::TooLarge {
        what: field,
        size: value,
        limit: widen(usize::MAX),
        unit: "bytes",
    })
}

/// A `usize` as a `u64`: lossless wherever this crate builds (the assertion below), so the
/// one `as` of the formats lives here.
pub fn widen(value: usize) -> u64 {
    const _: () = assert!(usize::BITS <= u64::BITS);
    value as u64
}

/// A `u32` field as an in-memory length or index: lossless wherever this crate builds (the
/// assertion below).
pub fn u32_to_usize(value: u32) -> usize {
    const _: () = assert!(u32::BITS <= usize::BITS);
    value as usize
}

fn too_large(field: &'static str, value: usize, limit: u64, unit: &'static str) -> Error {
    Error::TooLarge {
        what: field,
        size: widen(value),
        limit,
        unit,
    }
}

/// Most bytes of one LEB128 varint of a `u64` (7 bits per byte).
pub const MAX_VARINT_BYTES: usize = 10;

/// Appends `value` as an unsigned LEB128 varint: 7 bits per byte, least significant first,
/// bit 7 set on every byte but the last (format-spec F-06-31).
pub fn push_varint(out: &mut Vec<u8>, mut value: u64) {
    // The low byte of `value` holds its next 7 bits (and, for the last byte, all of them).
    while value >= 0x80 {
        out.push(value.to_le_bytes()[0] | 0x80);
        value >>= 7;
    }
    out.push(value.to_le_bytes()[0]);
}

/// The canonical LEB128 varint at the start of `bytes` and its length, or `None` when it is
/// cut short, longer than [`MAX_VARINT_BYTES`], overflows a `u64` or is not minimal (a last
/// byte of zero after the first): so every value has exactly one encoding.
pub fn read_varint(bytes: &[u8]) -> Option<(u64, usize)> {
    // One byte is the common case (row entries' gaps and lengths): no loop for it.
    if let Some(&byte) = bytes.first() {
        if byte & 0x80 == 0 {
            return Some((u64::from(byte), 1));
        }
    }
    let mut value = 0u64;
    for (position, byte) in bytes.iter().take(MAX_VARINT_BYTES).enumerate() {
        let bits = u64::from(byte & 0x7f);
        let shift = 7 * position;
        if position == MAX_VARINT_BYTES - 1 && *byte > 1 {
            return None;
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            return (position == 0 || *byte != 0).then_some((value, position + 1));
        }
    }
    None
}

/// `value` zigzag-mapped to an unsigned number (0, -1, 1, -2 … as 0, 1, 2, 3 …), so that
/// small negative numbers get short varints.
pub fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)).cast_unsigned()
}

/// The inverse of [`zigzag`].
pub fn unzigzag(value: u64) -> i64 {
    (value >> 1).cast_signed() ^ (value & 1).cast_signed().wrapping_neg()
}

/// Hex digits in a segment or run file name: the id as 16 lower-case hex digits.
const FILE_ID_HEX_DIGITS: usize = 16;

/// The file name of the file with `id` and `extension` (`0000000000000abc.seg`).
pub fn id_file_name(id: u64, extension: &str) -> String {
    format!("{id:016x}.{extension}")
}

/// Parses a name made by [`id_file_name`] back to its id; anything else (upper-case hex,
/// another length, another extension) is `None`.
pub fn parse_id_file_name(name: &str, extension: &str) -> Option<u64> {
    let hex = name.strip_suffix(extension)?.strip_suffix('.')?;
    let lower_hex = |byte: u8| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte);
    if hex.len() != FILE_ID_HEX_DIGITS || !hex.bytes().all(lower_hex) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_a_short_read_names_its_field() {
        let mut bytes = Vec::new();
        Writer::new(&mut bytes)
            .u8(7)
            .u16(0x0102)
            .u32(0x0304_0506)
            .u64(u64::MAX - 1)
            .i64(-5)
            .bytes(b"tail");
        let mut reader = Reader::new(&bytes);
        assert_eq!(reader.u8("a"), Ok(7));
        assert_eq!(reader.u16("b"), Ok(0x0102));
        assert_eq!(reader.u32("c"), Ok(0x0304_0506));
        assert_eq!(reader.u64("d"), Ok(u64::MAX - 1));
        assert_eq!(reader.i64("e"), Ok(-5));
        assert_eq!(reader.bytes(2, "f"), Ok(&b"ta"[..]));
        assert_eq!(
            reader.u32("g"),
            Err(ShortInput {
                field: "g",
                offset: 25,
                needed: 4,
                available: 2
            })
        );
        assert_eq!(reader.position(), 25, "a failed read consumes nothing");
        assert_eq!(reader.rest(), b"il");
        assert!(reader.is_at_end());
        assert_eq!(Reader::at(&bytes, 100).remaining(), 0);
        assert!(Reader::at(&bytes, 100).u8("past").is_err());
        assert!(Reader::new(&bytes).bytes(usize::MAX, "huge").is_err());
    }

    #[test]
    fn a_length_that_does_not_fit_its_field_is_too_large() {
        let mut out = Vec::new();
        let outcome = Writer::new(&mut out)
            .u16_length(70_000, "unit name")
            .map(|_| ());
        assert!(
            matches!(
                outcome,
                Err(Error::TooLarge {
                    what: "unit name",
                    unit: "bytes",
                    size: 70_000,
                    limit: 65_535
                })
            ),
            "{outcome:?}"
        );
        assert!(out.is_empty(), "nothing written");
        assert!(Writer::new(&mut out).u32_length(9, "count").is_ok());
        assert_eq!(out, 9u32.to_le_bytes());
    }

    #[test]
    fn id_file_names_parse_back_and_nothing_else_does() {
        let name = id_file_name(0xabc, "seg");
        assert_eq!(name, "0000000000000abc.seg");
        assert_eq!(parse_id_file_name(&name, "seg"), Some(0xabc));
        assert_eq!(parse_id_file_name(&name, "run"), None);
        for other in [
            "x.seg",
            "0000000000000ABC.seg",
            "000000000000abc.seg",
            "00000000000000abc.seg",
            "0000000000000abcseg",
            "+000000000000abc.seg",
        ] {
            assert_eq!(parse_id_file_name(other, "seg"), None, "{other}");
        }
    }
}
