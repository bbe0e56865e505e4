"""Schema checks of a decoded request, before any handler sees it.

kafka-python's decoders turn a null string or array into ``None`` whatever the JSON schema says,
and take strings of any length. Apache Kafka's generated readers refuse both while parsing
("non-nullable field X was serialized as null", "string field X had invalid length"); here
the same rules are checked on the decoded message, walking its schema:

* a field that is not nullable at the request's version is not null, nor is an element of an
  array (Kafka's arrays never hold nulls);
* a string is at most 32767 bytes of UTF-8 (Kafka's limit for every string field, compact or not).

A violation is an :class:`InvalidRequestField` naming the field path and the rule; the server
answers it with INVALID_REQUEST in the API's own error shape.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.schemas.fields.codecs import UUID, String

#: Kafka's bound on every string field (its readers refuse longer ones).
MAX_STRING_BYTES = 0x7FFF


class InvalidRequestField(ValueError):
    """A decoded field breaks its schema; the message names the field and the rule."""


def check_message(message: Any, version: int) -> None:
    """Raise InvalidRequestField if ``message`` breaks its schema at ``version``."""
    _check_struct(type(message)._struct, message, version, "")


def _check_struct(struct: Any, item: Any, version: int, path: str) -> None:
    for field in struct.fields.values():
        if not field.for_version_q(version):
            continue
        where = f"{path}{field._name}"
        value = getattr(item, field.name, None)
        if value is None:
            # kafka-python reads the all-zero UUID as None: a uuid is never "null" on the wire.
            if not field.nullable_for_version_q(version) and not _is_uuid(field):
                raise InvalidRequestField(f"{where} must not be null")
            continue
        if field.is_struct_array():
            for index, element in enumerate(value):
                if element is None:
                    raise InvalidRequestField(f"{where}[{index}] must not be null")
                _check_struct(field.array_of, element, version, f"{where}[{index}].")
        elif field.is_array():
            strings = _is_string(field.array_of)
            for index, element in enumerate(value):
                if element is None:
                    raise InvalidRequestField(f"{where}[{index}] must not be null")
                if strings:
                    _check_string(element, f"{where}[{index}]")
        elif field.is_struct():
            _check_struct(field, value, version, f"{where}.")
        elif _is_string(field):
            _check_string(value, where)


def _is_uuid(field: Any) -> bool:
    return getattr(field, "_type", None) is UUID


def _is_string(field: Any) -> bool:
    return isinstance(getattr(field, "_type", None), String)


def _check_string(value: str, where: str) -> None:
    # Cheap first: a string of at most MAX/4 characters cannot exceed MAX bytes of UTF-8.
    if len(value) > MAX_STRING_BYTES // 4 and len(value.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES:
        raise InvalidRequestField(f"{where} is longer than {MAX_STRING_BYTES} bytes")
