"""Request and response frames written in one buffer, with encoders compiled by kafka-python's
generator.

kafka-python 3 compiles one flat encode function per message version, but every struct of a
flexible version ends in a call to its generic tagged-fields writer, which looks up each tagged
field by name even when the struct has none; with the response header (also written by generic
code) and the copies that join header and body, that was most of the CPU of answering a small
request. Here:

* the encoders are compiled through a code generation context (``_InlineTagsCodegen``) that
  writes the empty tagged-field section of a struct without tagged fields inline (one zero
  byte, which is what the generic writer writes); a struct that has tagged fields keeps the
  generic call, so the bytes are the same in every case;
* the size, the header (written here: a few fixed fields, and an empty tagged-field section
  when flexible) and the body go into one thread-local buffer, copied out once. The server
  writes its responses so, and pystreams' own Kafka clients (the log writer) their requests.

kafka-python's classes and its own caches are left as they are (see ``linear_decoding`` for the
decoders).
"""

from __future__ import annotations

import re
import struct
import threading
from collections.abc import Callable
from typing import Any

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields.codecs.encode_buffer import EncodeBuffer
from kafka.protocol.schemas.fields.codegen import CodegenContext

_TAGGED_CALL = re.compile(r"(_tf\d+)\.encode_into\((.+), out, version=\d+\)")
_SIZE = _CORRELATION = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_REQUEST_HEADER = struct.Struct(">hhi")  # api key, api version, correlation id
_NULL_STRING = _INT16.pack(-1)
#: A buffer that grew past this for one large response is dropped afterwards, not kept.
KEPT_BUFFER_BYTES = 1 << 20


class _InlineTagsCodegen(CodegenContext):
    """kafka-python's code generation context, writing an empty tagged-field section inline."""

    def emit(self, indent: str, line: str) -> None:
        call = _TAGGED_CALL.fullmatch(line)
        if call is not None and not self.globs[call[1]]._names:
            # The generated code stored pos in out.pos just before, and reloads pos, buf and
            # the capacity from out just after, as it does around the generic call.
            line = "out.ensure(1); out.buf[out.pos] = 0; out.pos += 1"
        super().emit(indent, line)


_ENCODERS: dict[tuple[type, int], Callable[[Any, EncodeBuffer], None]] = {}


def _compile_encoder(message_class: Any, version: int) -> Callable[[Any, EncodeBuffer], None]:
    """What ``StructField.compiled_encode_into`` compiles, with empty tag sections inline."""
    flexible = bool(message_class.flexible_version_q(version))
    ctx = _InlineTagsCodegen()
    indent = "    "
    ctx.lines.append("def _encode(item, out):")
    ctx.emit(indent, "buf = out.buf")
    ctx.emit(indent, "pos = out.pos")
    ctx.emit(indent, "_cap = len(buf)")
    message_class._struct.emit_encode_into(ctx, "item", indent, version=version, compact=flexible, tagged=flexible)
    ctx.emit(indent, "out.pos = pos")
    exec(compile(ctx.source(), f"<pystreams_encode:{message_class.__name__}_v{version}>", "exec"), ctx.globs)
    encode: Callable[[Any, EncodeBuffer], None] = ctx.globs["_encode"]
    return encode


_local = threading.local()


def response_frame(correlation_id: int, flexible_header: bool, response: Any, version: int) -> bytes:
    """The size-prefixed frame of ``response`` at ``version``: response header v1 when
    ``flexible_header``, else v0, then the body."""
    return _frame(_CORRELATION.pack(correlation_id) + (b"\x00" if flexible_header else b""), response, version)


def request_frame(correlation_id: int, client_id: str | None, flexible_header: bool, request: Any, version: int) -> bytes:
    """The size-prefixed frame of ``request`` at ``version``: request header v2 when
    ``flexible_header``, else v1 (the client id is a legacy string in both), then the body."""
    header = _REQUEST_HEADER.pack(request.API_KEY, version, correlation_id)
    if client_id is None:
        name = _NULL_STRING
    else:
        encoded = client_id.encode("utf-8")
        name = _INT16.pack(len(encoded)) + encoded
    return _frame(header + name + (b"\x00" if flexible_header else b""), request, version)


def _frame(header: bytes, message: Any, version: int) -> bytes:
    if type(message).encode is not ApiMessage.encode:
        # A class with fix-ups of its own (MetadataRequest writes "all topics" as [] at v0):
        # its encode, as kafka-python would call it.
        body = bytes(message.encode(version=version))
        return _SIZE.pack(len(header) + len(body)) + header + body
    key = (type(message), version)
    encode = _ENCODERS.get(key)
    if encode is None:
        encode = _ENCODERS[key] = _compile_encoder(type(message), version)
    out = getattr(_local, "buffer", None)
    if out is None:
        out = _local.buffer = EncodeBuffer(4096)
    start = _SIZE.size + len(header)
    out.pos = 0
    out.ensure(start)
    out.buf[_SIZE.size : start] = header
    out.pos = start
    try:
        encode(message, out)
        _SIZE.pack_into(out.buf, 0, out.pos - _SIZE.size)
        return bytes(memoryview(out.buf)[: out.pos])
    finally:
        if len(out.buf) > KEPT_BUFFER_BYTES:
            _local.buffer = None
