"""Serdes: how keys and values become Kafka record bytes and back.

Every serde maps ``None`` to ``None`` both ways: a null key, or a tombstone value, passes
through untouched. Each serde has a stable ``name`` (no addresses, no module paths) that the
topology hash includes, so changing a serde changes the topology hash.

Wire formats, chosen to interoperate with Kafka's Java serializers:

============  =====================================================================
``Bytes``     the bytes as they are (Kafka's ``ByteArraySerializer``)
``Text``      UTF-8 by default (``StringSerializer``)
``Int``       signed two's-complement big-endian; 8 bytes by default, like
              ``LongSerializer`` (``Int(size=4)`` is ``IntegerSerializer``)
``Json``      JSON via msgspec; ``Json(type=T)`` decodes (and validates) into ``T``.
              JSON has no NaN or infinity: msgspec writes them as ``null``
``Struct``    a msgspec Struct as MessagePack (default) or JSON
``WindowedKey`` the inner key's bytes, then the window start and end as 8-byte
              big-endian ints (16 bytes appended)
============  =====================================================================

Defaults used by ``App`` when nothing is declared: keys ``Text()``, values ``Json()``. Counts
(``count``, and ``aggregate`` with an int ``initial``) are ``Int()``: 8-byte big-endian.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from typing import Any, Final

import msgspec

from pystreams.topology.windows import Windowed


class SerdeError(ValueError):
    """A value could not be serialized, or bytes could not be deserialized."""


#: What decoding bytes with msgspec may raise: not the format, not the declared shape, or a
#: string that is not UTF-8 (msgspec raises Python's own UnicodeDecodeError for that one).
UNDECODABLE: Final = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)


class Serde(ABC):
    """Serializer and deserializer for one kind of key or value."""

    @property
    @abstractmethod
    def name(self) -> str:
        """A stable identifier of the wire format (part of the topology hash)."""

    @abstractmethod
    def _to_bytes(self, value: Any) -> bytes: ...

    @abstractmethod
    def _from_bytes(self, data: bytes) -> Any: ...

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        return self._to_bytes(value)

    def deserialize(self, data: bytes | bytearray | memoryview | None) -> Any:
        if data is None:
            return None
        # Records arrive as bytes almost always; copying only views saves a call per record.
        return self._from_bytes(data if data.__class__ is bytes else bytes(data))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Serde) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<serde {self.name}>"

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A serde of ours pickles as its constructor call: the codecs it holds (msgspec
        # encoders, struct.Struct) do not pickle, and the Spark runtime ships nodes with their
        # serdes. Any other pickles as Python pickles objects.
        arguments = self._arguments()
        if arguments is None:
            return super().__reduce_ex__(protocol)
        return type(self), arguments

    def _arguments(self) -> tuple[Any, ...] | None:
        """What the constructor was called with; None: not known (a user's serde class)."""
        return None


class Bytes(Serde):
    """Raw bytes, unchanged."""

    name = "bytes"

    def _arguments(self) -> tuple[Any, ...]:
        return ()

    def _to_bytes(self, value: Any) -> bytes:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise SerdeError(f"Bytes serde needs bytes, got {type(value).__name__}")
        return bytes(value)

    def _from_bytes(self, data: bytes) -> bytes:
        return data


class Text(Serde):
    """A ``str`` in the given encoding (UTF-8 by default)."""

    def __init__(self, encoding: str = "utf-8") -> None:
        "".encode(encoding)  # fail now on an unknown encoding, not on the first record
        self.encoding = encoding

    def _arguments(self) -> tuple[Any, ...]:
        return (self.encoding,)

    @property
    def name(self) -> str:
        return "text" if self.encoding.lower().replace("_", "-") in ("utf-8", "utf8") else f"text:{self.encoding}"

    def _to_bytes(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise SerdeError(f"Text serde needs str, got {type(value).__name__}")
        try:
            return value.encode(self.encoding)
        except UnicodeError as error:
            raise SerdeError(f"cannot encode text as {self.encoding}: {error}") from error

    def _from_bytes(self, data: bytes) -> str:
        try:
            return data.decode(self.encoding)
        except UnicodeError as error:
            raise SerdeError(f"bytes are not valid {self.encoding}: {error}") from error


class Int(Serde):
    """A signed integer, big-endian two's complement, ``size`` bytes (8 = Kafka's Long)."""

    _FORMATS = {2: ">h", 4: ">i", 8: ">q"}

    def __init__(self, size: int = 8) -> None:
        if size not in self._FORMATS:
            raise ValueError(f"Int serde size must be 2, 4 or 8 bytes, got {size}")
        self.size = size
        self._codec = struct.Struct(self._FORMATS[size])

    def _arguments(self) -> tuple[Any, ...]:
        return (self.size,)

    @property
    def name(self) -> str:
        return f"int{self.size * 8}"

    def _to_bytes(self, value: Any) -> bytes:
        if not isinstance(value, int) or isinstance(value, bool):
            raise SerdeError(f"Int serde needs int, got {type(value).__name__}")
        try:
            return self._codec.pack(value)
        except struct.error as error:
            raise SerdeError(f"{value} does not fit in {self.size} signed bytes") from error

    def _from_bytes(self, data: bytes) -> int:
        if len(data) != self.size:
            raise SerdeError(f"{self.name} needs exactly {self.size} bytes, got {len(data)}")
        return self._codec.unpack(data)[0]


def _type_label(type_: Any) -> str:
    """A stable label for a type: its qualified name, or the typing repr for generics."""
    if isinstance(type_, type):
        return type_.__qualname__
    return repr(type_).replace("typing.", "")


class Json(Serde):
    """JSON through msgspec. With ``type=``, decoding validates and builds that type."""

    def __init__(self, type: Any = Any) -> None:
        self.type = type
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(type)

    def _arguments(self) -> tuple[Any, ...]:
        return (self.type,)

    @property
    def name(self) -> str:
        return "json" if self.type is Any else f"json:{_type_label(self.type)}"

    def _to_bytes(self, value: Any) -> bytes:
        try:
            return self._encoder.encode(value)
        except (TypeError, msgspec.EncodeError) as error:
            raise SerdeError(f"cannot encode {type(value).__name__} as JSON: {error}") from error

    def _from_bytes(self, data: bytes) -> Any:
        try:
            return self._decoder.decode(data)
        except UNDECODABLE as error:
            raise SerdeError(f"bad JSON for {self.name}: {error}") from error


class Struct(Serde):
    """A msgspec ``Struct`` type, as MessagePack (compact, the default) or JSON."""

    FORMATS = ("msgpack", "json")

    def __init__(self, struct_type: type[msgspec.Struct], format: str = "msgpack") -> None:
        if not (isinstance(struct_type, type) and issubclass(struct_type, msgspec.Struct)):
            raise TypeError(f"Struct serde needs a msgspec.Struct subclass, got {struct_type!r}")
        if format not in self.FORMATS:
            raise ValueError(f"Struct serde format must be one of {self.FORMATS}, got {format!r}")
        self.struct_type = struct_type
        self.format = format
        module = msgspec.msgpack if format == "msgpack" else msgspec.json
        self._encoder = module.Encoder()
        self._decoder = module.Decoder(struct_type)

    def _arguments(self) -> tuple[Any, ...]:
        return (self.struct_type, self.format)

    @property
    def name(self) -> str:
        # The qualified name only: the module path depends on how an app file was loaded.
        return f"struct:{self.struct_type.__qualname__}:{self.format}"

    def _to_bytes(self, value: Any) -> bytes:
        if not isinstance(value, self.struct_type):
            raise SerdeError(f"{self.name} needs a {self.struct_type.__qualname__}, got {type(value).__name__}")
        return self._encoder.encode(value)

    def _from_bytes(self, data: bytes) -> Any:
        try:
            return self._decoder.decode(data)
        except UNDECODABLE as error:
            raise SerdeError(f"bad {self.format} for {self.name}: {error}") from error


class WindowedKey(Serde):
    """Keys of windowed aggregations: the inner key, then window start and end (8 bytes each)."""

    _BOUNDS = struct.Struct(">qq")

    def __init__(self, inner: Serde) -> None:
        self.inner = inner

    def _arguments(self) -> tuple[Any, ...]:
        return (self.inner,)

    @property
    def name(self) -> str:
        return f"windowed({self.inner.name})"

    def _to_bytes(self, value: Any) -> bytes:
        if not isinstance(value, Windowed):
            raise SerdeError(f"{self.name} needs a Windowed key, got {type(value).__name__}")
        inner = self.inner.serialize(value.key) or b""
        return inner + self._BOUNDS.pack(value.start_ms, value.end_ms)

    @classmethod
    def base_key_bytes(cls, data: bytes) -> bytes:
        """The serialized user key of a serialized windowed key (Kafka Streams'
        ``serializeBaseKey``): what the windowed partitioner hashes."""
        return data[: -cls._BOUNDS.size]

    def _from_bytes(self, data: bytes) -> Windowed:
        if len(data) < self._BOUNDS.size:
            raise SerdeError(f"{self.name} needs at least {self._BOUNDS.size} bytes, got {len(data)}")
        start, end = self._BOUNDS.unpack(data[-self._BOUNDS.size :])
        return Windowed(self.inner.deserialize(data[: -self._BOUNDS.size]), start, end)


class Change(Serde):
    """A table update on its way to a grouped table's aggregation: ``(new, old)``, each a
    value of ``inner`` or None (Kafka Streams' ``Change`` and its ``ChangedSerializer``); the
    repartition topic of ``table.group_by`` carries both, so the aggregation can subtract the
    old one and add the new one."""

    _PAIR = msgspec.msgpack.Decoder(tuple[bytes | None, bytes | None])
    _ENCODE = msgspec.msgpack.Encoder().encode

    def __init__(self, inner: Serde) -> None:
        self.inner = inner

    def _arguments(self) -> tuple[Any, ...]:
        return (self.inner,)

    @property
    def name(self) -> str:
        return f"change({self.inner.name})"

    def _to_bytes(self, value: Any) -> bytes:
        if not (isinstance(value, tuple) and len(value) == 2):
            raise SerdeError(f"{self.name} needs a (new, old) pair, got {type(value).__name__}")
        new, old = value
        return self._ENCODE((self.inner.serialize(new), self.inner.serialize(old)))

    def _from_bytes(self, data: bytes) -> tuple[Any, Any]:
        try:
            new, old = self._PAIR.decode(data)
        except (*UNDECODABLE, ValueError) as error:  # ValueError: not two items
            raise SerdeError(f"{self.name}: not a (new, old) pair: {error}") from None
        return self.inner.deserialize(new), self.inner.deserialize(old)


class Inferred(Serde):
    """The serde an aggregation picked from its ``initial`` (``for_value``): that serde's format
    and name, with a write error that says where it came from and what to pass instead (an
    ``initial=0`` whose accumulator becomes a float fails at its first such record)."""

    def __init__(self, inner: Serde, initial: Any) -> None:
        self.inner = inner
        self._initial = initial

    def _arguments(self) -> tuple[Any, ...]:
        return (self.inner, self._initial)

    @property
    def name(self) -> str:
        return self.inner.name

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_") or attribute == "inner":
            raise AttributeError(attribute)  # not delegated: unpickling looks these up first
        return getattr(self.inner, attribute)  # e.g. a Struct serde's struct_type

    def _to_bytes(self, value: Any) -> bytes:
        try:
            return self.inner._to_bytes(value)
        except SerdeError as error:
            raise SerdeError(
                f"{error}: the value serde {self.inner.name} was inferred from initial={self._initial!r}; pass value= a serde that "
                "holds the accumulator (serdes.Json() for numbers that may be floats)"
            ) from None

    def _from_bytes(self, data: bytes) -> Any:
        return self.inner._from_bytes(data)


def inferred_from(initial: Any) -> Serde | None:
    """``for_value(initial)`` as an ``Inferred`` serde, or None."""
    picked = for_value(initial)
    return None if picked is None else Inferred(picked, initial)


def for_value(example: Any) -> Serde | None:
    """The natural serde for values like ``example`` (an aggregate's ``initial``), or None.

    An int gives ``Int()``, a str ``Text()``, bytes ``Bytes()``, a Struct (instance or class,
    since a class works as an initial-value factory) ``Struct(cls)``. Anything else: None,
    meaning "use the app default".
    """
    if isinstance(example, bool):
        return None
    if isinstance(example, int):
        return Int()
    if isinstance(example, str):
        return Text()
    if isinstance(example, bytes):
        return Bytes()
    if isinstance(example, msgspec.Struct):
        return Struct(type(example))
    if isinstance(example, type) and issubclass(example, msgspec.Struct):
        return Struct(example)
    return None
