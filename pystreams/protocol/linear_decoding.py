"""Linear, bounded decoders for the Kafka messages pystreams reads, compiled by kafka-python's
code generator without changing it.

kafka-python 3 compiles one flat decode function per message version. Two of the code
fragments it emits are unsafe on bytes a stranger chose:

* **Tagged fields** are decoded by copying *the rest of the frame* (``bytes(data[pos:])``) into
  a ``BytesIO`` for every struct that carries any, so a frame of many small structs with tags
  costs time quadratic in its size: an 8 MB request kept the event loop for most of a minute.
  Here they read through a zero-copy view of the frame instead.
* **Unsigned varints** (lengths, counts) are read with no bound on their length, so a run of
  continuation bytes builds an ever larger integer. Kafka's ``ByteUtils.readUnsignedVarint``
  refuses a varint longer than 5 bytes; so does the decoder here.

``decode_body`` compiles pystreams' own decoders into its own cache, through a code generation
context (``_GuardedCodegen``) that rewrites those two fragments as kafka-python emits them.
kafka-python's classes and its cache of decoders are left as they are: the user's own
kafka-python clients in the same process decode exactly as kafka-python does. kafka-python is
pinned below 4 in pyproject.toml; a generator whose fragments no longer match is refused when a
decoder is compiled (``DecoderGuardError``) and ``tests/test_protocol_hostile_input.py`` pins
the behaviour, so an upgrade fails loudly rather than silently re-opening the hole.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kafka.protocol.schemas.fields.codegen import CodegenContext

#: Kafka's limit: an unsigned varint32 takes at most 5 bytes.
MAX_VARINT32_BYTES = 5


class VarintTooLong(ValueError):
    pass


class TruncatedField(ValueError):
    pass


class FrameView:
    """A read-only ``BytesIO`` stand-in over a memoryview, from ``start``: no copy is made.

    Unlike ``BytesIO`` a sized read past the end of the frame raises: kafka-python reads an
    unknown tagged field with ``read(size)``, and a short read would otherwise keep whatever
    bytes a truncated frame still held as the field (Kafka's reader refuses it too)."""

    __slots__ = ("_data", "_start", "_pos")

    def __init__(self, data: memoryview | bytes, start: int) -> None:
        self._data = data
        self._start = start
        self._pos = start

    def read(self, size: int = -1) -> bytes:
        if size is not None and size > len(self._data) - self._pos:
            raise TruncatedField(f"truncated: {size} bytes wanted, {len(self._data) - self._pos} left")
        end = len(self._data) if size is None or size < 0 else self._pos + size
        chunk = bytes(self._data[self._pos : end])
        self._pos = end
        return chunk

    def tell(self) -> int:
        return self._pos - self._start


class DecoderGuardError(RuntimeError):
    """kafka-python's generator emitted a decoder this module cannot guard (it changed)."""


#: The fragments of kafka-python's generated decoders rewritten here (see the module docstring).
_TOP_OBJECT = re.compile(r"obj = object\.__new__\((_dc\d+)\)")
_FRAME_COPY = re.compile(r"(_bio\d+) = _BytesIO\(bytes\(data\[pos:\]\)\)")
_VARINT_SHIFT = re.compile(r"(\s*)(_sh\d+) \+= 7")


class _GuardedCodegen(CodegenContext):
    """kafka-python's code generation context, rewriting the unsafe fragments as they are
    emitted: a tagged-field copy of the rest of the frame becomes a ``FrameView``, and every
    varint loop gets a bound."""

    def __init__(self, message_class: Any) -> None:
        super().__init__()
        self.globs["_FrameView"] = FrameView
        self.globs["_VarintTooLong"] = VarintTooLong
        self._message_class = message_class
        self.varint_loops = 0
        self.bounded_varints = 0

    def emit(self, indent: str, line: str) -> None:
        if (top := _TOP_OBJECT.fullmatch(line)) is not None:
            # The message class itself (the generator's own is a weak proxy; kafka-python's
            # ``compiled_decode_from`` swaps it the same way).
            self.globs[top[1]] = self._message_class
        if (copy := _FRAME_COPY.fullmatch(line)) is not None:
            line = f"{copy[1]} = _FrameView(data, pos)"
        super().emit(indent, line)
        if (shift := _VARINT_SHIFT.fullmatch(line)) is not None:
            self.bounded_varints += 1
            bound = 7 * MAX_VARINT32_BYTES
            super().emit(indent, f"{shift[1]}if {shift[2]} >= {bound}: raise _VarintTooLong('a varint longer than {MAX_VARINT32_BYTES} bytes')")
        elif line.strip() == "while True:":
            self.varint_loops += 1

    def checked_source(self) -> str:
        source: str = self.source()
        if "_BytesIO(" in source or self.varint_loops != self.bounded_varints:
            raise DecoderGuardError("kafka-python's decoder generator changed; pystreams.protocol.linear_decoding needs updating")
        return source


_DECODERS: dict[tuple[Any, int], Callable[[memoryview | bytes, int], tuple[Any, int]]] = {}


def _compile_decoder(message_class: Any, version: int) -> Callable[[memoryview | bytes, int], tuple[Any, int]]:
    """What ``StructField.compiled_decode_from`` compiles, guarded, and cached here only."""
    flexible = bool(message_class.flexible_version_q(version))
    ctx = _GuardedCodegen(message_class[None])
    ctx.lines.append("def _decode(data, pos):")
    message_class._struct.emit_decode_from(ctx, "obj", "    ", version=version, compact=flexible, tagged=flexible)
    ctx.emit("    ", "return obj, pos")
    exec(compile(ctx.checked_source(), f"<pystreams_decode:{message_class.__name__}_v{version}>", "exec"), ctx.globs)
    decode: Callable[[memoryview | bytes, int], tuple[Any, int]] = ctx.globs["_decode"]
    return decode


def decode_body(message_class, data: memoryview, version: int):
    """(message, end offset) of one message body; the end tells a truncated frame apart.

    ``ApiMessage.decode`` drops the end offset, and a string or bytes field that runs past the
    end of the frame is silently cut short by slicing, so the caller must check ``end``.
    """
    decode = _DECODERS.get((message_class, version))
    if decode is None:
        decode = _DECODERS[(message_class, version)] = _compile_decoder(message_class, version)
    return decode(data, 0)
