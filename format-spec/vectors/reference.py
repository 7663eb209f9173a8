#!/usr/bin/env python3
"""Independent reference encoder for the dshdb format-spec golden vectors.

Written from the spec text (format-spec/*.md), not from the engine: it writes every
`<name>.bin` and its expected decoding `<name>.json`. The engine's own encoders must produce
the same bytes (engine/tests/format_vectors.rs checks that, and its ignored test
`regenerate_vectors_with_engine_encoders` rewrites the .bin files from the JSON with the
engine's encoders, which must leave them unchanged).

Run from anywhere: python3 format-spec/vectors/reference.py
"""

import json
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))

FRAME_SALT = 0x0123456789ABCDEF
SEGMENT_SALT = 0xFEEDFACECAFEBEEF
NO_SEED_PARENT = 0xFFFFFFFF

KIND = {
    "session_header": 1,
    "type_definition": 2,
    "event": 3,
    "commit": 4,
    "seal": 5,
    "tombstone": 6,
    "row_entry": 7,
}


def crc32(data):
    return zlib.crc32(data) & 0xFFFFFFFF


def hex64(value):
    return "0x%016x" % value


def hex32(value):
    return "0x%08x" % value


def frame(salt, kind, flags, payload):
    body = struct.pack("<IBBBB", len(payload), kind, flags, 0, 0) + payload
    return struct.pack("<I", crc32(struct.pack("<Q", salt) + body)) + body


def payload(record):
    kind = record["kind"]
    if kind == "session_header":
        return struct.pack(
            "<IIQ", record["session"], record["seed_parent"], record["seed_length"]
        ) + record["header_json"].encode()
    if kind == "type_definition":
        return struct.pack("<I", record["type_number"]) + record["name"].encode()
    if kind == "event":
        data = record["data"].encode()
        return (
            struct.pack(
                "<IQqIBI",
                record["session"],
                record["seq"],
                record["time"],
                record["type_number"],
                record["flags"],
                len(data),
            )
            + data
            + record["envelope"].encode()
        )
    if kind == "commit":
        return struct.pack(
            "<IQIQ",
            record["session"],
            record["first_seq"],
            record["event_count"],
            record["durable_offset"],
        )
    if kind == "seal":
        return struct.pack("<QQ", record["used_bytes"], record["durable_offset"])
    if kind == "tombstone":
        return struct.pack("<I", record["session"])
    if kind == "row_entry":
        return row_entry_payload(record)
    raise ValueError(kind)


def varint(value):
    """Unsigned LEB128 (06-runs-and-index.md F-06-30)."""
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def zigzag(value):
    return ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF


def row_entry_payload(record):
    """A row entry (F-06-30; in a segment F-02-20): fixed fields, prefix, suffix, the
    members' time gaps, their payload lengths, then the payloads."""
    members = record["members"]
    prefix = record["prefix"].encode()
    suffix = record["suffix"].encode()
    payloads = [member["payload"].encode() for member in members]
    fixed = struct.pack(
        "<IQIIBBqII",
        record["session"],
        record["first_seq"],
        len(members),
        record["type_number"],
        record["first_flags"],
        record["member_flags"],
        members[0]["time"],
        len(prefix),
        len(suffix),
    )
    gaps = b"".join(
        varint(zigzag(later["time"] - earlier["time"]))
        for earlier, later in zip(members, members[1:])
    )
    lengths = b"".join(varint(len(item)) for item in payloads)
    return fixed + prefix + suffix + gaps + lengths + b"".join(payloads)


def record_frame(salt, record):
    return frame(salt, KIND[record["kind"]], 0, payload(record))


def frame_facts(salt, raw):
    checksum, length, kind, flags = struct.unpack_from("<IIBB", raw, 0)
    assert crc32(struct.pack("<Q", salt) + raw[4:]) == checksum
    return {
        "checksum": hex32(checksum),
        "length": length,
        "kind": kind,
        "flags": flags,
        "total_bytes": len(raw),
    }


def json_string(text):
    """serde_json's string serialisation (F-02-12)."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char == '"':
            out.append('\\"')
        elif char == "\\":
            out.append("\\\\")
        elif char == "\b":
            out.append("\\b")
        elif char == "\t":
            out.append("\\t")
        elif char == "\n":
            out.append("\\n")
        elif char == "\f":
            out.append("\\f")
        elif char == "\r":
            out.append("\\r")
        elif code < 0x20:
            out.append("\\u%04x" % code)
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def json_line(event, type_name):
    """F-02-12."""
    if event["flags"] & 1:
        return event["envelope"]
    line = '{"type":%s,"seq":%d,"time":%d,"data":%s' % (
        json_string(type_name),
        event["seq"],
        event["time"],
        event["data"],
    )
    if event["envelope"]:
        line += "," + event["envelope"]
    return line + "}"


def segment_header(segment_id, salt):
    head = b"DSHDBSEG" + struct.pack("<IIQQ", 1, 64, segment_id, salt) + bytes(28)
    return head + struct.pack("<I", crc32(head))


def manifest(segments, next_segment_id):
    body = b"DSHDBMAN" + struct.pack("<IIQ", 1, len(segments), next_segment_id)
    for segment_id, salt in segments:
        body += struct.pack("<QQ", segment_id, salt)
    return body + struct.pack("<I", crc32(body))


def write(name, raw, expected):
    with open(os.path.join(HERE, name + ".bin"), "wb") as out:
        out.write(raw)
    with open(os.path.join(HERE, name + ".json"), "w") as out:
        json.dump(expected, out, indent=2, ensure_ascii=False)
        out.write("\n")


def frame_vector(name, description, record, export_type=None):
    raw = record_frame(FRAME_SALT, record)
    expected = {
        "description": description,
        "salt": hex64(FRAME_SALT),
        "frame": frame_facts(FRAME_SALT, raw),
        "record": record,
    }
    if export_type is not None:
        expected["export"] = {
            "type_name": export_type,
            "json_line": json_line(record, export_type),
        }
    write(name, raw, expected)


def main():
    frame_vector(
        "frame-session-header",
        "A session header of a fork: session 1 shares the first 2 events of session 0.",
        {
            "kind": "session_header",
            "session": 1,
            "seed_parent": 0,
            "seed_length": 2,
            "header_json": '{"version":0,"id":"fork-1","createdAt":1733011200000,'
            '"parentSession":"main","seedLength":2}',
        },
    )
    frame_vector(
        "frame-type-definition",
        "Type number 3 is named assistant/text.",
        {"kind": "type_definition", "type_number": 3, "name": "assistant/text"},
    )
    frame_vector(
        "frame-event",
        "One event with an envelope member; exported with type 3 = assistant/text.",
        {
            "kind": "event",
            "session": 7,
            "seq": 42,
            "time": 1733011200000,
            "type_number": 3,
            "flags": 0,
            "data": '{"text":"hi"}',
            "envelope": '"surfaceOp":"append"',
        },
        export_type="assistant/text",
    )
    frame_vector(
        "frame-event-verbatim",
        "An event stored with VERBATIM_LINE|BATCH_START (0x03): export returns the envelope.",
        {
            "kind": "event",
            "session": 7,
            "seq": 43,
            "time": -1,
            "type_number": 3,
            "flags": 3,
            "data": '{"text":"yo"}',
            "envelope": '{"seq":43,"type":"assistant/text","time":-1,"data":{"text":"yo"}}',
        },
        export_type="assistant/text",
    )
    frame_vector(
        "frame-event-row",
        "An event with ROW_MEMBER (0x08): an export hint only; the line is built as usual.",
        {
            "kind": "event",
            "session": 7,
            "seq": 44,
            "time": 1733011200500,
            "type_number": 3,
            "flags": 8,
            "data": '{"text":" there"}',
            "envelope": "",
        },
        export_type="assistant/text",
    )
    frame_vector(
        "frame-commit",
        "A commit of 2 events of session 7 from seq 42; bytes below 4096 were durable.",
        {
            "kind": "commit",
            "session": 7,
            "first_seq": 42,
            "event_count": 2,
            "durable_offset": 4096,
        },
    )
    frame_vector(
        "frame-seal",
        "A seal at offset 1024 written at a clean close.",
        {"kind": "seal", "used_bytes": 1024, "durable_offset": 1024},
    )
    frame_vector(
        "frame-tombstone",
        "A tombstone deleting session 7 (F-02-18).",
        {"kind": "tombstone", "session": 7},
    )

    frame_vector(
        "frame-row-entry",
        "A row entry in a segment (F-02-20): session 7, seqs 44..46 of type 3, an imported "
        "DSH row of three chunks (ROW_START|BATCH_START, then ROW_MEMBER) with a negative "
        "time gap; checksummed under the salt like any segment frame.",
        {
            "kind": "row_entry",
            "session": 7,
            "first_seq": 44,
            "type_number": 3,
            "first_flags": 6,
            "member_flags": 8,
            "prefix": '{"turn":1,"step":0,"chunk":{"type":"text-delta","index":0,"text":',
            "suffix": "}}",
            "members": [
                {"time": 1733011200500, "payload": '"Hel"'},
                {"time": 1733011200512, "payload": '"lo, "'},
                {"time": 1733011200509, "payload": '"w\\u00f6rld"'},
            ],
        },
    )

    # An unknown record kind (200) with the skippable flag: readers skip it (F-02-7).
    raw = frame(FRAME_SALT, 200, 1, b"future")
    write(
        "frame-unknown-skippable",
        raw,
        {
            "description": "Kind 200 (unknown to version 1) with flags bit 0 set: a reader skips it.",
            "salt": hex64(FRAME_SALT),
            "frame": frame_facts(FRAME_SALT, raw),
            "payload_utf8": "future",
        },
    )

    write(
        "segment-header",
        segment_header(1, SEGMENT_SALT),
        {
            "description": "The 64-byte header of segment 1.",
            "magic": "DSHDBSEG",
            "version": 1,
            "header_bytes": 64,
            "segment_id": hex64(1),
            "salt": hex64(SEGMENT_SALT),
            "header_checksum": hex32(crc32(segment_header(1, SEGMENT_SALT)[:60])),
        },
    )

    manifest_segments = [(1, 0x1111111111111111), (3, SEGMENT_SALT)]
    raw = manifest(manifest_segments, 4)
    write(
        "manifest",
        raw,
        {
            "description": "A manifest naming segments 1 and 3; the next segment gets id 4.",
            "magic": "DSHDBMAN",
            "version": 1,
            "next_segment_id": hex64(4),
            "segments": [
                {"id": hex64(segment_id), "salt": hex64(salt)}
                for segment_id, salt in manifest_segments
            ],
            "checksum": hex32(struct.unpack_from("<I", raw, len(raw) - 4)[0]),
        },
    )

    two_sessions()
    fork()


def event(session, seq, time, type_number, data, envelope="", flags=0):
    return {
        "kind": "event",
        "session": session,
        "seq": seq,
        "time": time,
        "type_number": type_number,
        "flags": flags,
        "data": data,
        "envelope": envelope,
    }


def session_header(session, header_json, seed=None):
    parent, length = seed if seed is not None else (NO_SEED_PARENT, 0)
    return {"kind": "session_header", "session": session, "seed_parent": parent,
            "seed_length": length, "header_json": header_json}


def segment_vector(name, description, types, batches):
    """A whole, sealed and trimmed segment 1, laid out as a Sync writer writes it."""
    salt = SEGMENT_SALT
    raw = segment_header(1, salt)
    records = []
    durable = 64  # Sync mode: each commit records where the previous batch ended.
    for batch in batches:
        batch_start = len(raw)
        for item in batch:
            if isinstance(item, tuple):
                _, session, first_seq, count = item
                item = {"kind": "commit", "session": session, "first_seq": first_seq,
                        "event_count": count, "durable_offset": durable}
            entry = {"offset": len(raw)}
            entry.update(item)
            records.append(entry)
            raw += record_frame(salt, item)
        durable = len(raw)
        assert batch_start < durable
    seal = {"kind": "seal", "used_bytes": len(raw), "durable_offset": len(raw)}
    entry = {"offset": len(raw)}
    entry.update(seal)
    records.append(entry)
    raw += record_frame(salt, seal)

    headers = {r["session"]: r for r in records if r["kind"] == "session_header"}

    def session_events(number, end=None):
        """F-02-17: a fork's first seed_length events are its parent's (recursively)."""
        header = headers[number]
        own = [r for r in records if r["kind"] == "event" and r["session"] == number]
        if header["seed_parent"] == NO_SEED_PARENT:
            events = own
        else:
            events = session_events(header["seed_parent"], header["seed_length"]) + own
        assert [e["seq"] for e in events] == list(range(len(events)))
        return events if end is None else events[:end]

    sessions = []
    for number in sorted(headers):
        header = headers[number]["header_json"]
        sessions.append({
            "number": number,
            "id": json.loads(header)["id"],
            "header_json": header,
            "json_lines": [json_line(e, types[e["type_number"]])
                           for e in session_events(number)],
        })
    write(
        name,
        raw,
        {
            "description": description,
            "segment_id": hex64(1),
            "salt": hex64(salt),
            "file_bytes": len(raw),
            "sealed": True,
            "records": records,
            "types": {str(k): v for k, v in types.items()},
            "sessions": sessions,
        },
    )


def two_sessions():
    alpha = '{"version":0,"id":"alpha","createdAt":1733011200000}'
    beta = '{"version":0,"id":"beta","createdAt":1733011202000}'
    verbatim = (
        '{"type":"assistant/text","seq":1,"time":1733011204000,'
        '"data":{"text":"ok"},"ignorable":true}'
    )
    segment_vector(
        "segment-two-sessions",
        "Segment 1 of a store: header, three committed batches of two "
        "sessions, seal; trimmed after the seal.",
        {0: "user/message", 1: "assistant/text"},
        [
            [
                session_header(0, alpha),
                {"kind": "type_definition", "type_number": 0, "name": "user/message"},
                event(0, 0, 1733011201000, 0, '{"text":"hello"}'),
                ("commit", 0, 0, 1),
            ],
            [
                session_header(1, beta),
                {"kind": "type_definition", "type_number": 1, "name": "assistant/text"},
                event(1, 0, 1733011202500, 0, '{"text":"hi, beta"}'),
                event(1, 1, 1733011203000, 1, '{"text":"hello back"}', '"surfaceOp":"append"'),
                ("commit", 1, 0, 2),
            ],
            [
                event(0, 1, 1733011204000, 1, '{"text":"ok"}', verbatim, flags=1),
                ("commit", 0, 1, 1),
            ],
        ],
    )


def fork():
    main_header = '{"version":0,"id":"main","createdAt":1733011200000}'
    fork_header = (
        '{"version":0,"id":"fork-1","createdAt":1733011205000,'
        '"parentSession":"main","seedLength":2}'
    )
    segment_vector(
        "segment-fork",
        "Segment 1 of a store: session main (3 events) and fork-1, a fork of main after "
        "seq 1 (seed_length 2) with 2 events of its own; events carry importer flags.",
        {0: "assistant/chunk", 1: "session/end-seed", 2: "user/message"},
        [
            [
                session_header(0, main_header),
                {"kind": "type_definition", "type_number": 0, "name": "assistant/chunk"},
                event(0, 0, 1733011201000, 0, '{"text":"a"}', flags=0x06),
                event(0, 1, 1733011201000, 0, '{"text":"b"}', flags=0x08),
                ("commit", 0, 0, 2),
            ],
            [
                session_header(1, fork_header, seed=(0, 2)),
                {"kind": "type_definition", "type_number": 1, "name": "session/end-seed"},
                event(1, 2, 1733011205000, 1, "{}", flags=0x02),
                ("commit", 1, 2, 1),
            ],
            [
                event(0, 2, 1733011206000, 0, '{"text":"c"}', flags=0x06),
                ("commit", 0, 2, 1),
            ],
            [
                {"kind": "type_definition", "type_number": 2, "name": "user/message"},
                event(1, 3, 1733011207000, 2, '{"text":"in the fork"}', flags=0x02),
                ("commit", 1, 3, 1),
            ],
        ],
    )


if __name__ == "__main__":
    main()
