"""kafka-python's generated request decoders, made linear and bounded for untrusted input.

kafka-python 3 compiles one flat decode function per message version. Two of the code
fragments it emits are unsafe on bytes a stranger chose:

* **Tagged fields** are decoded by copying *the rest of the frame* (``bytes(data[pos:])``) into
  a ``BytesIO`` for every struct that carries any, so a frame of many small structs with tags
  costs time quadratic in its size: an 8 MB request kept the event loop for most of a minute.
  Here they read through a zero-copy view of the frame instead.
* **Unsigned varints** (lengths, counts) are read with no bound on their length, so a run of
  continuation bytes builds an ever larger integer. Kafka's ``ByteUtils.readUnsignedVarint``
  refuses a varint longer than 5 bytes; so does the decoder here.

``install()`` swaps these two emitters in before any decoder is compiled (``pystreams``
imports this module first). kafka-python is pinned below 4 in pyproject.toml;
``tests/test_protocol_decoding.py`` pins the behaviour, so an upgrade that moves these
internals fails loudly there rather than silently re-opening the hole.
"""

from __future__ import annotations

from kafka.protocol.schemas.fields.codecs import types as _types
from kafka.protocol.schemas.fields.struct import StructField

#: Kafka's limit: an unsigned varint32 takes at most 5 bytes.
MAX_VARINT32_BYTES = 5

_installed = False


class VarintTooLong(ValueError):
    pass


class FrameView:
    """A read-only ``BytesIO`` stand-in over a memoryview, from ``start``: no copy is made."""

    __slots__ = ("_data", "_start", "_pos")

    def __init__(self, data: memoryview | bytes, start: int) -> None:
        self._data = data
        self._start = start
        self._pos = start

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size is None or size < 0 else min(len(self._data), self._pos + size)
        chunk = bytes(self._data[self._pos : end])
        self._pos = end
        return chunk

    def tell(self) -> int:
        return self._pos - self._start


def _emit_bounded_uvarint_decode(cls, ctx, var_name: str, indent: str) -> None:
    byte, shift = ctx.next_var("b"), ctx.next_var("sh")
    ctx.globs["_VarintTooLong"] = VarintTooLong
    ctx.emit(indent, f"{var_name} = 0")
    ctx.emit(indent, f"{shift} = 0")
    ctx.emit(indent, "while True:")
    ctx.emit(indent, f"    {byte} = data[pos]")
    ctx.emit(indent, "    pos += 1")
    ctx.emit(indent, f"    {var_name} |= ({byte} & 0x7f) << {shift}")
    ctx.emit(indent, f"    if not ({byte} & 0x80): break")
    ctx.emit(indent, f"    {shift} += 7")
    ctx.emit(indent, f"    if {shift} >= {7 * MAX_VARINT32_BYTES}: raise _VarintTooLong('a varint longer than {MAX_VARINT32_BYTES} bytes')")


def _emit_zero_copy_tagged_decode(self, ctx, var_name: str, indent: str, version: int) -> None:
    tagged = ctx.next_var("tf")
    reader = ctx.next_var("view")
    ctx.globs[tagged] = self.tagged_fields(version)
    ctx.globs["_FrameView"] = FrameView
    ctx.emit(indent, f"{reader} = _FrameView(data, pos)")
    ctx.emit(indent, f"_tfd = {tagged}.decode({reader}, version={version})")
    ctx.emit(indent, f"pos += {reader}.tell()")
    ctx.emit(indent, "if _tfd:")
    ctx.emit(indent, "    for _tk, _tv in _tfd.items():")
    ctx.emit(indent, '        if _tk.startswith("_"):')
    ctx.emit(indent, f"            if {var_name}.unknown_tags is None: {var_name}.unknown_tags = {{}}")
    ctx.emit(indent, f"            {var_name}.unknown_tags[_tk] = _tv")
    ctx.emit(indent, "        else:")
    ctx.emit(indent, f"            if {var_name}.tags is None: {var_name}.tags = set()")
    ctx.emit(indent, f"            {var_name}.tags.add(_tk)")
    ctx.emit(indent, f"            setattr({var_name}, _tk, _tv)")


def decode_body(message_class, data: memoryview, version: int):
    """(message, end offset) of one message body; the end tells a truncated frame apart.

    ``ApiMessage.decode`` drops the end offset, and a string or bytes field that runs past the
    end of the frame is silently cut short by slicing, so the caller must check ``end``.
    """
    flexible = bool(message_class.flexible_version_q(version))
    decode = message_class._struct.compiled_decode_from(version, compact=flexible, tagged=flexible, data_class=message_class[None])
    return decode(data, 0)


def install() -> None:
    """Patch kafka-python's decoder generators (idempotent)."""
    global _installed
    if _installed:
        return
    for owner, name in ((_types.UnsignedVarInt32, "emit_decode_from"), (StructField, "_emit_tagged_decode")):
        if not hasattr(owner, name):  # kafka-python moved its internals: refuse to run unprotected
            raise ImportError(f"kafka-python's {owner.__name__}.{name} is gone; pystreams.protocol.linear_decoding needs updating")
    _types.UnsignedVarInt32.emit_decode_from = classmethod(_emit_bounded_uvarint_decode)
    StructField._emit_tagged_decode = _emit_zero_copy_tagged_decode
    _installed = True
