"""The fluent spelling (``stream.map(fn, ...)``) and the decorator spelling
(``app.map(stream, ...)(fn)``) of every operation declare the same topology, and the fluent
methods built from the App methods show those methods' parameters and docstrings."""

from __future__ import annotations

import inspect
import pydoc
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from pystreams import serdes
from pystreams.app import (
    App,
    JoinWindow,
    Processor,
    Stream,
    Table,
    TumblingWindow,
    kv_store,
    until_time_limit,
)


def to_pair(key: Any, value: Any) -> tuple[Any, Any]:
    return key, value


def to_pairs(key: Any, value: Any) -> list[tuple[Any, Any]]:
    return [(key, value)]


def to_value(key: Any, value: Any) -> Any:
    return value


def to_values(key: Any, value: Any) -> list[Any]:
    return [value]


def keep(key: Any, value: Any) -> bool:
    return True


def label(key: Any, value: Any) -> str:
    return "small"


def add(total: Any, key: Any, value: Any) -> Any:
    return total + value


def pair_up(key: Any, left: Any, right: Any) -> Any:
    return (left, right)


class Relay(Processor):
    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value)


WINDOW = TumblingWindow(size=timedelta(minutes=1))

#: Each operation declared both ways: ``declare(app, stream, other_stream, table, fluent)``.
SPELLINGS: dict[str, Callable[[App, Stream, Stream, Table, bool], Any]] = {
    "map": lambda app, s, o, t, fluent: s.map(to_pair, key=serdes.Int(), name="m") if fluent else app.map(s, key=serdes.Int(), name="m")(to_pair),
    "map_values": lambda app, s, o, t, fluent: s.map_values(to_value, value=serdes.Text()) if fluent else app.map_values(s, value=serdes.Text())(to_value),
    "flat_map": lambda app, s, o, t, fluent: s.flat_map(to_pairs, key_changing=False) if fluent else app.flat_map(s, key_changing=False)(to_pairs),
    "flat_map_values": lambda app, s, o, t, fluent: s.flat_map_values(to_values) if fluent else app.flat_map_values(s)(to_values),
    "filter": lambda app, s, o, t, fluent: s.filter(keep, name="f") if fluent else app.filter(s, name="f")(keep),
    "peek": lambda app, s, o, t, fluent: s.peek(keep) if fluent else app.peek(s)(keep),
    "group_by": lambda app, s, o, t, fluent: (
        s.group_by(to_value, key=serdes.Int()).count() if fluent else app.count(app.group_by(s, key=serdes.Int())(to_value))
    ),
    "branch": lambda app, s, o, t, fluent: s.branch(label, ["small", "big"]) if fluent else app.branch(s, branches=["small", "big"])(label),
    "merge": lambda app, s, o, t, fluent: s.merge(o, name="both") if fluent else app.merge(s, o, name="both"),
    "repartition": lambda app, s, o, t, fluent: s.repartition(name="again", partitions=3) if fluent else app.repartition(s, name="again", partitions=3),
    "count": lambda app, s, o, t, fluent: (
        s.count(store="counts", window=WINDOW, emit="final") if fluent else app.count(s, store="counts", window=WINDOW, emit="final")
    ),
    "aggregate": lambda app, s, o, t, fluent: s.aggregate(add, initial=0, store="sums") if fluent else app.aggregate(s, initial=0, store="sums")(add),
    "reduce": lambda app, s, o, t, fluent: s.reduce(add, window=WINDOW) if fluent else app.reduce(s, window=WINDOW)(add),
    "join a table": lambda app, s, o, t, fluent: s.join(t, pair_up, how="left") if fluent else app.join(s, t, how="left")(pair_up),
    "join a stream": lambda app, s, o, t, fluent: (
        s.join(o, pair_up, window=JoinWindow(before=1000, after=1000)) if fluent else app.join(s, o, window=JoinWindow(before=1000, after=1000))(pair_up)
    ),
    "cogroup": lambda app, s, o, t, fluent: (s.cogroup(add) if fluent else app.cogroup().cogroup(s, add)).cogroup(o, add).aggregate(initial=0, store="both"),
    "process": lambda app, s, o, t, fluent: s.process(Relay, stores=[kv_store("seen")]) if fluent else app.processor(s, stores=[kv_store("seen")])(Relay),
    "to": lambda app, s, o, t, fluent: s.to("out", value=serdes.Text()) if fluent else app.to(s, "out", value=serdes.Text()),
    "table to": lambda app, s, o, t, fluent: t.to("table-out") if fluent else app.to(t, "table-out"),
    "to_stream": lambda app, s, o, t, fluent: t.to_stream(name="updates") if fluent else app.to_stream(t, name="updates"),
    "suppress": lambda app, s, o, t, fluent: (
        t.suppress(until_time_limit(timedelta(seconds=5)), store="held") if fluent else app.suppress(t, until_time_limit(timedelta(seconds=5)), store="held")
    ),
}


def declared(operation: str, *, fluent: bool) -> App:
    app = App("spellings")
    declare = SPELLINGS[operation]
    declare(app, app.topic("in"), app.topic("in-too"), app.table("tab"), fluent)
    return app


@pytest.mark.parametrize("operation", sorted(SPELLINGS))
def test_the_fluent_and_the_decorator_spelling_declare_the_same_topology(operation: str) -> None:
    fluent, decorated = declared(operation, fluent=True), declared(operation, fluent=False)
    assert len(fluent._nodes) > 3, "the operation declared nothing"
    assert fluent._nodes == decorated._nodes
    assert fluent._stores == decorated._stores
    assert fluent.topology().hash == decorated.topology().hash


def test_every_app_operation_on_a_handle_has_a_fluent_method() -> None:
    takes_a_handle = {
        name
        for name, method in vars(App).items()
        if callable(method)
        and not name.startswith("_")
        and list(inspect.signature(method).parameters)[1:2] in (["stream"], ["table"], ["left"], ["source"], ["streams"])
    }
    fluent_name = {"processor": "process"}
    for name in takes_a_handle:
        assert hasattr(Stream, fluent_name.get(name, name)) or hasattr(Table, name), name
    assert {"map", "join", "processor", "to", "suppress", "merge"} <= takes_a_handle


#: The fluent methods built from App methods: (handle, method, App method, decorated argument).
BUILT = [(Stream, name, name, "fn") for name in ("map", "map_values", "flat_map", "flat_map_values", "filter", "peek", "group_by", "aggregate", "reduce")]
BUILT += [(Stream, "process", "processor", "processor_class")]
BUILT += [(Stream, name, name, None) for name in ("merge", "repartition", "count", "to")]
BUILT += [(Table, name, name, None) for name in ("to_stream", "suppress", "to")]


@pytest.mark.parametrize(("handle", "name", "operation", "decorated"), BUILT, ids=[f"{h.__name__}.{n}" for h, n, _, _ in BUILT])
def test_a_built_fluent_method_shows_its_app_methods_parameters_and_docstring(handle: type, name: str, operation: str, decorated: str | None) -> None:
    method = getattr(handle, name)
    app_method = getattr(App, operation)
    app_parameters = list(inspect.signature(app_method).parameters.values())
    options = app_parameters[1:] if name == "merge" else app_parameters[2:]  # merge's streams are all inputs
    leading = ["self"] if decorated is None else ["self", decorated]
    assert list(inspect.signature(method).parameters) == leading + [p.name for p in options]
    assert list(inspect.signature(method).parameters.values())[len(leading) :] == options  # kinds, defaults, annotations
    assert method.__qualname__.endswith(f".{name}")
    assert inspect.cleandoc(app_method.__doc__) in inspect.getdoc(method)
    app = App("bound")
    bound = getattr(app.topic("in") if handle is Stream else app.table("in"), name)
    assert list(inspect.signature(bound).parameters) == leading[1:] + [p.name for p in options]
    help_text = pydoc.render_doc(method, renderer=pydoc.plaintext)
    assert f"{name}(self" in help_text and all(p.name in help_text for p in options)


def test_a_fluent_method_refuses_what_its_app_method_refuses() -> None:
    app = App("refusals")
    stream = app.topic("in")
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        stream.map(to_pair, bogus=1)
    with pytest.raises(TypeError, match="positional argument"):
        stream.count("counts")  # store= is keyword-only, as in app.count
