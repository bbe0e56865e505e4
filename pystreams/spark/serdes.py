"""Serdes that survive the trip to Spark's Python workers.

pystreams serdes hold msgspec encoders and ``struct.Struct`` codecs, which do not pickle.
``ShippedSerde`` pickles the recipe (class and constructor arguments) and rebuilds the serde
on the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pystreams import serdes


def serde_recipe(serde: serdes.Serde) -> tuple[Callable[..., serdes.Serde], tuple[Any, ...]] | None:
    """How to rebuild ``serde`` elsewhere, or None for serde classes we do not know."""
    match serde:
        case serdes.Inferred():
            return serde_recipe(serde.inner)  # its format; the hint of its write errors stays on workers
        case serdes.WindowedKey():
            inner = serde_recipe(serde.inner)
            return None if inner is None else (_windowed, inner)
        case serdes.Bytes():
            return serdes.Bytes, ()
        case serdes.Text():
            return serdes.Text, (serde.encoding,)
        case serdes.Int():
            return serdes.Int, (serde.size,)
        case serdes.Json():
            return serdes.Json, (serde.type,)
        case serdes.Struct():
            return serdes.Struct, (serde.struct_type, serde.format)
    return None


def _windowed(factory: Callable[..., serdes.Serde], args: tuple[Any, ...]) -> serdes.Serde:
    return serdes.WindowedKey(factory(*args))


class ShippedSerde(serdes.Serde):
    """Wraps a serde; pickles as its recipe (or as itself, for user serdes that pickle). A serde
    itself, so a node can hold it where it held the serde."""

    __slots__ = ("serde", "_recipe")

    def __init__(self, serde: serdes.Serde) -> None:
        self.serde = serde
        self._recipe = serde_recipe(serde)

    def __getstate__(self) -> Any:
        return ("recipe", self._recipe) if self._recipe is not None else ("serde", self.serde)

    def __setstate__(self, state: Any) -> None:
        how, payload = state
        if how == "recipe":
            factory, args = payload
            self.serde = factory(*args)
            self._recipe = payload
        else:
            self.serde = payload
            self._recipe = None

    @property
    def name(self) -> str:
        return self.serde.name

    def _to_bytes(self, value: Any) -> bytes:
        data = self.serde.serialize(value)
        assert data is not None  # serialize() only calls this for a value that is not None
        return data

    def _from_bytes(self, data: bytes) -> Any:
        return self.serde.deserialize(data)

    # The wrapped serde's own handling of None (and of any bytes-like input), unchanged.
    def serialize(self, value: Any) -> bytes | None:
        return self.serde.serialize(value)

    def deserialize(self, data: Any) -> Any:
        return self.serde.deserialize(data)
