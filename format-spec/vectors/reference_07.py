#!/usr/bin/env python3
"""Independent reference encoder for the chapter-07 golden vectors (cache and spill).

Written from format-spec/07-cache-and-spill.md alone. Needs the `blake3` package
(`pip install blake3`); the zstd frame of the blob vector is built by hand (one raw block),
so no zstd library is needed. Writes `cache-checkpoint.{bin,json}` and
`spill-blob.{bin,json}`; engine/tests/format_vectors_07.rs decodes them with the engine.

Run from anywhere: python3 format-spec/vectors/reference_07.py
"""

import json
import os
import struct

from blake3 import blake3

HERE = os.path.dirname(os.path.abspath(__file__))


def digest(data):
    return blake3(data).digest()


def write(name, data, decoded):
    with open(os.path.join(HERE, name + ".bin"), "wb") as out:
        out.write(data)
    with open(os.path.join(HERE, name + ".json"), "w") as out:
        json.dump(decoded, out, indent=2)
        out.write("\n")


def checkpoint():
    """F-07-1..F-07-4: unit `stats`, state version 1, 3 events folded (three `turn/end`
    events with data `{"turn":1}`, times 1790000000000 + seq, no envelope, flags 0)."""
    session = "s-1"
    header = '{"version":0,"id":"s-1","createdAt":1790000000000}'
    identity = digest(session.encode() + b"\x00" + header.encode())
    # F-07-4: the anchor hashes the event at seq N - 1 = 2.
    seq, time, event_type, data, envelope, flags = 2, 1790000000002, "turn/end", '{"turn":1}', "", 0
    anchor_input = struct.pack("<Qq", seq, time)
    for field in (event_type, data, envelope):
        raw = field.encode()
        anchor_input += struct.pack("<Q", len(raw)) + raw
    anchor_input += bytes([flags])
    anchor = digest(anchor_input)
    unit = b"stats"
    # The stats unit's postcard state after three `turn/end` events: events 3, by_type
    # {"turn/end": 3}, usage {}, messages_with_usage 0 (opaque to the layout itself).
    state = bytes([3, 1, 8]) + b"turn/end" + bytes([3, 0, 0])
    body = b"DSHDBPC1" + struct.pack("<HH", 1, len(unit)) + unit
    body += struct.pack("<IQ", 1, 3) + identity + anchor
    body += struct.pack("<Q", len(state)) + state
    data_bytes = body + digest(body)
    write("cache-checkpoint", data_bytes, {
        "description": "Checkpoint of unit stats (state version 1) after 3 events of session s-1.",
        "file_name": "cache/" + digest(session.encode()).hex()[:32] + "/stats-v1-00000000000000000003.ckpt",
        "session": session,
        "header": header,
        "anchor_event": {"seq": seq, "time": time, "type": event_type, "data": data,
                         "envelope": envelope, "flags": flags},
        "unit": "stats",
        "state_version": 1,
        "seq": 3,
        "identity": identity.hex(),
        "anchor": anchor.hex(),
        "state": state.hex(),
        "checksum": digest(body).hex(),
    })


def blob():
    """F-07-10: a blob whose payload is one raw zstd block."""
    payload = b"The full tool output, kept whole.\n"
    block_header = (1 | (0 << 1) | (len(payload) << 3)).to_bytes(3, "little")
    frame = struct.pack("<I", 0xFD2FB528) + bytes([0x20, len(payload)]) + block_header + payload
    hash_ = digest(payload)
    body = b"DSHDBSP1" + struct.pack("<HQ", 1, len(payload)) + hash_
    body += struct.pack("<Q", len(frame)) + frame
    write("spill-blob", body + digest(body), {
        "description": "Blob of a 34-byte payload; the zstd frame holds one raw block.",
        "file_name": "spill/" + hash_.hex(),
        "locator": "dshdb-spill:" + hash_.hex(),
        "raw_bytes": len(payload),
        "payload": payload.decode(),
        "checksum": digest(body).hex(),
    })


checkpoint()
blob()
