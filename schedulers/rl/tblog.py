"""A dependency-free TensorBoard event-file writer for scalars, as a stable-baselines3 logger output.

The ``tensorboard`` package (and its grpcio/protobuf dependencies) is not a
hetsim dependency, so SB3's own "tensorboard" output is unavailable. This
writes the same on-disk format TensorBoard reads: a TFRecord file
``events.out.tfevents.TIME.HOST`` of ``Event`` protocol buffers (wall_time,
step, and a ``Summary`` of ``simple_value`` scalars), each record framed by
its length and masked CRC-32C checksums.
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path
from typing import Any

from stable_baselines3.common.logger import KVWriter


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of TFRecord files."""
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field_bytes(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def event_bytes(wall_time: float, step: int, scalars: dict[str, float] | None = None,
                file_version: str | None = None) -> bytes:
    """One serialized ``tensorflow.Event``."""
    msg = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(int(step))
    if file_version is not None:
        msg += _field_bytes(3, file_version.encode())
    if scalars:
        summary = b"".join(
            _field_bytes(1, _field_bytes(1, tag.encode()) + b"\x15" + struct.pack("<f", float(v)))
            for tag, v in scalars.items())
        msg += _field_bytes(5, summary)
    return msg


def record_bytes(data: bytes) -> bytes:
    """``data`` framed as a TFRecord."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", _masked(header)) + data + struct.pack("<I", _masked(data))


def read_scalars(path: str | Path) -> list[tuple[int, str, float]]:
    """(step, tag, value) of every scalar in an event file (checks every checksum)."""
    raw = Path(path).read_bytes()
    out: list[tuple[int, str, float]] = []
    pos = 0
    while pos < len(raw):
        (n,) = struct.unpack_from("<Q", raw, pos)
        if struct.unpack_from("<I", raw, pos + 8)[0] != _masked(raw[pos:pos + 8]):
            raise ValueError(f"{path}: bad length checksum at byte {pos}")
        data = raw[pos + 12: pos + 12 + n]
        if struct.unpack_from("<I", raw, pos + 12 + n)[0] != _masked(data):
            raise ValueError(f"{path}: bad data checksum at byte {pos}")
        pos += 16 + n
        out.extend(_parse_event(data))
    return out


def _read_varint(b: bytes, i: int) -> tuple[int, int]:
    shift = val = 0
    while True:
        c = b[i]
        i += 1
        val |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return val, i


def _fields(b: bytes) -> list[tuple[int, Any]]:
    i, out = 0, []
    v: Any
    while i < len(b):
        key, i = _read_varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            n, i = _read_varint(b, i)
            v, i = b[i:i + n], i + n
        out.append((num, v))
    return out


def _parse_event(data: bytes) -> list[tuple[int, str, float]]:
    step, out = 0, []
    fs = _fields(data)
    for num, v in fs:
        if num == 2:
            step = v
    for num, v in fs:
        if num == 5:
            for _, value in _fields(v):
                vf = dict(_fields(value))
                out.append((step, vf[1].decode(), struct.unpack("<f", vf[2])[0]))
    return out


class TensorBoardEvents(KVWriter):
    """SB3 logger output writing numeric values as TensorBoard scalars into ``folder``."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self.file = self.path.open("wb")
        self.file.write(record_bytes(event_bytes(time.time(), 0, file_version="brain.Event:2")))
        self.file.flush()

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]],
              step: int = 0) -> None:
        scalars = {k: float(v) for k, v in key_values.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)
                   and "tensorboard" not in (key_excluded.get(k) or ())}
        if hasattr(key_values, "items"):
            for k, v in key_values.items():
                if k not in scalars and hasattr(v, "item") and getattr(v, "size", 2) == 1:
                    scalars[k] = float(v.item())
        if scalars:
            self.file.write(record_bytes(event_bytes(time.time(), step, scalars)))
            self.file.flush()

    def close(self) -> None:
        if not self.file.closed:
            self.file.close()
