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
    _check(_plan(type(message)._struct, version), message, "")


# A plan is the schema walk done once per struct and version: for each field of the version,
# (attribute, field name, may it be null, what to check, the plan of its elements). Walking the
# schema itself took a tenth of the CPU of serving a small request.
_NOTHING, _STRING, _STRUCT, _STRUCT_ARRAY, _ARRAY, _STRING_ARRAY = range(6)
_Plan = tuple[tuple[str, str, bool, int, Any], ...]
_PLANS: dict[tuple[int, int], tuple[Any, _Plan]] = {}


def _plan(struct: Any, version: int) -> _Plan:
    key = (id(struct), version)
    cached = _PLANS.get(key)
    if cached is None:
        # The struct is kept in the entry, so its id cannot be reused by another.
        cached = _PLANS[key] = (struct, _compile(struct, version))
    plan: _Plan = cached[1]
    return plan


def _compile(struct: Any, version: int) -> _Plan:
    plan = []
    for field in struct.fields.values():
        if not field.for_version_q(version):
            continue
        # kafka-python reads the all-zero UUID as None: a uuid is never "null" on the wire.
        nullable = bool(field.nullable_for_version_q(version)) or _is_uuid(field)
        elements: Any = None
        if field.is_struct_array():
            kind, elements = _STRUCT_ARRAY, _compile(field.array_of, version)
        elif field.is_array():
            kind = _STRING_ARRAY if _is_string(field.array_of) else _ARRAY
        elif field.is_struct():
            kind, elements = _STRUCT, _compile(field, version)
        elif _is_string(field):
            kind = _STRING
        else:
            kind = _NOTHING
        plan.append((field.name, field._name, nullable, kind, elements))
    return tuple(plan)


def _check(plan: _Plan, item: Any, path: str) -> None:
    for name, label, nullable, kind, elements in plan:
        value = getattr(item, name, None)
        if value is None:
            if not nullable:
                raise InvalidRequestField(f"{path}{label} must not be null")
            continue
        if kind == _NOTHING:
            continue
        if kind == _STRING:
            if _too_long(value):
                raise _string_too_long(f"{path}{label}")
        elif kind == _STRUCT_ARRAY:
            for index, element in enumerate(value):
                if element is None:
                    raise InvalidRequestField(f"{path}{label}[{index}] must not be null")
                _check(elements, element, f"{path}{label}[{index}].")
        elif kind == _STRUCT:
            _check(elements, value, f"{path}{label}.")
        else:
            for index, element in enumerate(value):
                if element is None:
                    raise InvalidRequestField(f"{path}{label}[{index}] must not be null")
                if kind == _STRING_ARRAY and _too_long(element):
                    raise _string_too_long(f"{path}{label}[{index}]")


def _is_uuid(field: Any) -> bool:
    return getattr(field, "_type", None) is UUID


def _is_string(field: Any) -> bool:
    return isinstance(getattr(field, "_type", None), String)


def _too_long(value: str) -> bool:
    # Cheap first: a string of at most MAX/4 characters cannot exceed MAX bytes of UTF-8.
    return len(value) > MAX_STRING_BYTES // 4 and len(value.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES


def _string_too_long(where: str) -> InvalidRequestField:
    return InvalidRequestField(f"{where} is longer than {MAX_STRING_BYTES} bytes")
