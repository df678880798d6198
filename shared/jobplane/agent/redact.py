"""A job's secret values replaced with *** in everything the agent uploads (pure, no I/O).

Each value is matched raw and in the encodings a script may print it in: base64 (standard and URL-safe, padded or
not, and at each of the three alignments it can have inside a longer encoded string), hex, URL-encoded and
JSON-escaped. Output is redacted as a stream (`feed`): a value cut across two writes or two log chunks is still
found, because the tail that could begin one is held back until what follows decides it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

from jobplane.model.secrets import REDACTED

# A derived form shorter than this (the inside of a tiny value's base64) would mask ordinary text: only the raw
# value and its whole encodings are kept then.
MIN_FORM = 6


def _base64_forms(value: bytes) -> set[bytes]:
    forms: set[bytes] = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(value)
        forms |= {whole, whole.rstrip(b"=")}
        for shift in range(3):  # the value after `shift` bytes of something else, inside a longer encoding
            encoded = encode(b"\0" * shift + value)
            # the characters that depend only on the value: past the ones shared with what precedes it, before
            # the last group's, which depend on what follows
            start = (shift * 8 + 5) // 6
            end = ((shift + len(value)) * 8) // 6
            core = encoded[start:end]
            if len(core) >= MIN_FORM:
                forms.add(core)
    return forms


def forms(value: bytes) -> set[bytes]:
    """The byte strings that give the value away: raw, base64, hex, URL-encoded, JSON-escaped."""
    found = {value, binascii.hexlify(value), binascii.hexlify(value).upper(), *_base64_forms(value)}
    try:
        text = value.decode()
    except UnicodeDecodeError:
        text = None
    if text is not None:
        found |= {quote(text, safe="").encode(), quote(text).encode(), quote_plus(text).encode(),
                  json.dumps(text)[1:-1].encode(), json.dumps(text, ensure_ascii=False)[1:-1].encode()}
    return {f for f in found if f == value or len(f) >= MIN_FORM}


class Redactor:
    """The values' forms, longest first (so a whole encoding wins over the core it contains)."""

    def __init__(self, values: Iterable[bytes]) -> None:
        every = {f for v in values if v for f in forms(v)}
        self._forms = sorted(every, key=len, reverse=True)
        self._pattern = re.compile(b"|".join(re.escape(f) for f in self._forms)) if every else None
        self._starts = frozenset(f[0] for f in self._forms)
        self._longest = len(self._forms[0]) if every else 0
        self._hold = b""

    def __bool__(self) -> bool:
        return self._pattern is not None

    def redact(self, data: bytes) -> bytes:
        """Every form in a whole piece of data replaced."""
        return self._pattern.sub(REDACTED, data) if self._pattern is not None else data

    def text(self, text: str) -> str:
        return self.redact(text.encode()).decode(errors="replace") if self._pattern is not None else text

    def feed(self, data: bytes) -> bytes:
        """The next piece of a stream: what can be passed on now, redacted; the tail that might begin a form is kept
        for the next piece (or `flush`)."""
        if self._pattern is None:
            return data
        buf, out, pos = self._hold + data, [], 0
        for match in self._pattern.finditer(buf):
            out += [buf[pos:match.start()], REDACTED]
            pos = match.end()
        cut = self._unfinished(buf, pos)
        self._hold = buf[cut:]
        out.append(buf[pos:cut])
        return b"".join(out)

    def flush(self) -> bytes:
        """What was held back: the stream ended (or something else is written after it)."""
        held, self._hold = self._hold, b""
        return self.redact(held)

    def _unfinished(self, buf: bytes, pos: int) -> int:
        """Where the earliest tail of buf (from pos on) that is a proper prefix of some form begins; len(buf) if
        none is."""
        for i in range(max(pos, len(buf) - self._longest + 1), len(buf)):
            if buf[i] in self._starts:
                tail = buf[i:]
                if any(len(f) > len(tail) and f.startswith(tail) for f in self._forms):
                    return i
        return len(buf)


# ---- binary files (TensorBoard event files): the same length masked, each TFRecord's checksum made again -------------
def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's checksum of a record's bytes (TensorFlow's masked CRC-32C)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def mask_file(redactor: Redactor, data: bytes) -> bytes:
    """A file's bytes with every form of a value overwritten by as many `*`: a protobuf's lengths still hold, and
    each TFRecord (an event file's: length, its CRC, the record, its CRC) whose bytes changed gets its CRC again, so
    TensorBoard reads the file as before, the text summaries masked. A file of another format keeps its layout."""
    if redactor._pattern is None:
        return data
    masked = redactor._pattern.sub(lambda m: b"*" * len(m.group()), data)
    if masked == data:
        return data
    out, pos = bytearray(masked), 0
    while pos + 12 <= len(out):  # TFRecords one after another; stop at anything else (a cut last record too)
        length = int.from_bytes(out[pos:pos + 8], "little")
        end = pos + 12 + length + 4
        if end > len(out) or masked_crc(bytes(out[pos:pos + 8])) != int.from_bytes(out[pos + 8:pos + 12], "little"):
            break
        body = bytes(out[pos + 12:pos + 12 + length])
        if body != data[pos + 12:pos + 12 + length]:
            out[end - 4:end] = masked_crc(body).to_bytes(4, "little")
        pos = end
    return bytes(out)
