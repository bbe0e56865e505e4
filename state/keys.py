"""Byte layouts of window and session keys.

A composite key is ``escaped(key) + timestamps``:

* ``escaped(key)`` replaces every 0x00 byte with 0x00 0xFF and ends with 0x00 0x01. The
  encoding keeps the byte order of user keys and is prefix-free, so all entries of one key
  are contiguous and sort before those of any longer key that shares its prefix; a range scan
  over one key never sees another key's entries.
* timestamps are 8-byte big-endian with the sign bit flipped, so byte order is numeric order
  (negative timestamps included).

Window store entry: ``escaped(key) + ts(window_start)``.
Session store entry: ``escaped(key) + ts(session_end) + ts(session_start)`` — end first, as in
Kafka Streams, so "sessions of key ending at or after T" is one contiguous scan.

The composite key is also the changelog record key of these stores.
"""

from __future__ import annotations

import struct

TIMESTAMP_BYTES = 8
WINDOW_SUFFIX_BYTES = TIMESTAMP_BYTES
SESSION_SUFFIX_BYTES = 2 * TIMESTAMP_BYTES
MIN_TIMESTAMP = -(2**63)
MAX_TIMESTAMP = 2**63 - 1

_SIGN_FLIP = 2**63
_pack_u64 = struct.Struct(">Q").pack
_unpack_u64 = struct.Struct(">Q").unpack
_unpack_two_u64 = struct.Struct(">QQ").unpack
_KEY_END = b"\x00\x01"
_ZERO = b"\x00"
_ESCAPED_ZERO = b"\x00\xff"


def encode_timestamp(timestamp: int) -> bytes:
    return _pack_u64(timestamp + _SIGN_FLIP)


def decode_timestamp(encoded: bytes) -> int:
    return _unpack_u64(encoded)[0] - _SIGN_FLIP


def escape_key(key: bytes) -> bytes:
    return key.replace(_ZERO, _ESCAPED_ZERO) + _KEY_END


def unescape_key(escaped: bytes) -> bytes:
    """Inverse of escape_key; ``escaped`` includes the two-byte terminator."""
    return escaped[:-2].replace(_ESCAPED_ZERO, _ZERO)


def key_prefix_end(escaped: bytes) -> bytes:
    """Smallest byte string greater than every composite key starting with ``escaped``.

    ``escaped`` ends with 0x00 0x01, so bumping the last byte to 0x02 is enough."""
    return escaped[:-1] + b"\x02"


def window_key(key: bytes, window_start: int) -> bytes:
    return escape_key(key) + _pack_u64(window_start + _SIGN_FLIP)


def split_window_key(composite: bytes) -> tuple[bytes, int]:
    """(key, window_start) of a window-store composite key."""
    return (
        composite[:-10].replace(_ESCAPED_ZERO, _ZERO),
        _unpack_u64(composite[-8:])[0] - _SIGN_FLIP,
    )


def window_start_of(composite: bytes) -> int:
    return _unpack_u64(composite[-8:])[0] - _SIGN_FLIP


def session_key(key: bytes, start: int, end: int) -> bytes:
    return escape_key(key) + _pack_u64(end + _SIGN_FLIP) + _pack_u64(start + _SIGN_FLIP)


def split_session_key(composite: bytes) -> tuple[bytes, int, int]:
    """(key, start, end) of a session-store composite key."""
    end, start = _unpack_two_u64(composite[-16:])
    return (
        composite[:-18].replace(_ESCAPED_ZERO, _ZERO),
        start - _SIGN_FLIP,
        end - _SIGN_FLIP,
    )


def session_end_of(composite: bytes) -> int:
    return _unpack_u64(composite[-16:-8])[0] - _SIGN_FLIP


def session_start_of(composite: bytes) -> int:
    return _unpack_u64(composite[-8:])[0] - _SIGN_FLIP
