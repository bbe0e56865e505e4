"""The foreign-key table–table join (Kafka Streams' KIP-213), inner and left, on the worker's
kernels through the test driver: fixed scenarios, and a Hypothesis property — any interleaving
of left updates (foreign-key changes and deletes included) and right updates and deletes ends
with the join an offline join of the final tables gives, and the last result sent per key is
that one (no stale answer comes after it)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pystreams.topology import foreign_key as fk
from pystreams.topology.errors import TopologyError

from pystreams import serdes
from pystreams.app import App
from pystreams.testing import TopologyTestDriver


def _enrich(key: str, order: dict[str, Any], customer: dict[str, Any] | None) -> str:
    return f"{key}@{customer['city'] if customer is not None else None}"


def _customer_of(key: str, order: dict[str, Any]) -> str | None:
    return order.get("customer")


def fk_app(how: str, *, store: str | None = None) -> App:
    app = App(f"fk-{how}")
    orders = app.table("orders", value=serdes.Json())
    customers = app.table("customers", value=serdes.Json())
    orders.join(customers, _enrich, foreign_key=_customer_of, how=how, value=serdes.Text(), store=store, name="enriched").to_stream().to("out")
    return app


def offline(how: str, orders: dict[str, dict[str, Any]], customers: dict[str, dict[str, Any]]) -> dict[str, str]:
    joined = {}
    for key, order in orders.items():
        customer = customers.get(order["customer"]) if order.get("customer") is not None else None
        if customer is not None or how == "left":
            joined[key] = _enrich(key, order, customer)
    return joined


def test_an_order_follows_its_customers_changes_and_its_own_move_to_another_customer() -> None:
    with TopologyTestDriver(fk_app("inner")) as driver:
        orders, customers, out = driver.input_topic("orders"), driver.input_topic("customers"), driver.output_topic("out")
        customers.pipe_input("c1", {"city": "Oslo"}, timestamp=1)
        orders.pipe_input("o1", {"customer": "c1"}, timestamp=2)
        assert out.read_key_values() == [("o1", "o1@Oslo")]
        orders.pipe_input("o2", {"customer": "c2"}, timestamp=3)  # no such customer yet: no result
        assert out.read_key_values() == [("o2", None)]
        customers.pipe_input("c2", {"city": "Rome"}, timestamp=4)
        customers.pipe_input("c1", {"city": "Bergen"}, timestamp=5)
        assert out.read_key_values() == [("o2", "o2@Rome"), ("o1", "o1@Bergen")]
        orders.pipe_input("o1", {"customer": "c3"}, timestamp=6)  # moves to a customer with no row
        assert out.read_key_values() == [("o1", None)]
        customers.pipe_input("c1", {"city": "Paris"}, timestamp=7)  # o1 left c1: nothing for it
        assert out.read_key_values() == []
        customers.pipe_input("c2", None, timestamp=8)
        orders.pipe_input("o2", None, timestamp=9)
        assert out.read_key_values() == [("o2", None), ("o2", None)]


def test_a_left_join_keeps_orders_without_a_customer_and_a_none_foreign_key() -> None:
    with TopologyTestDriver(fk_app("left", store="enriched-orders")) as driver:
        orders, customers = driver.input_topic("orders"), driver.input_topic("customers")
        orders.pipe_input("o1", {"customer": "c1"}, timestamp=1)
        orders.pipe_input("o2", {"customer": None}, timestamp=2)
        customers.pipe_input("c1", {"city": "Oslo"}, timestamp=3)
        assert driver.store_contents("enriched-orders") == {"o1": "o1@Oslo", "o2": "o2@None"}
        customers.pipe_input("c1", None, timestamp=4)
        orders.pipe_input("o2", None, timestamp=5)
        assert driver.store_contents("enriched-orders") == {"o1": "o1@None"}


def test_an_answer_to_an_earlier_left_value_is_dropped_as_stale() -> None:
    """The rule the design rests on: an answer carries the hash of the value it answers."""
    current = serdes.Json().serialize({"customer": "c2"})
    earlier = serdes.Json().serialize({"customer": "c1"})
    assert fk.value_hash(current) != fk.value_hash(earlier)
    assert fk.value_hash(None) is None


PROPAGATE = fk.Instruction.PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE


@pytest.mark.parametrize(
    ("old", "new", "sent"),
    [
        (None, (b"a",), [(b"a", PROPAGATE)]),
        ((b"a",), (b"a",), [(b"a", PROPAGATE)]),
        ((b"a",), (b"b",), [(b"a", fk.Instruction.DELETE_KEY_NO_PROPAGATE), (b"b", PROPAGATE)]),
        ((b"a",), (None,), [(b"a", fk.Instruction.DELETE_KEY_NO_PROPAGATE), (None, PROPAGATE)]),
        ((b"a",), None, [(b"a", fk.Instruction.DELETE_KEY_AND_PROPAGATE)]),
        ((None,), (b"a",), [(b"a", PROPAGATE)]),
        ((None,), None, [(None, PROPAGATE)]),
        (None, (None,), [(None, PROPAGATE)]),
        (None, None, []),
    ],
)
def test_every_change_of_a_left_row_gets_exactly_one_answer_that_sets_its_result(old: Any, new: Any, sent: Any) -> None:
    assert fk.subscriptions(old, new) == sent
    answered = [key for key, instruction in sent if instruction is not fk.Instruction.DELETE_KEY_NO_PROPAGATE]
    assert len(answered) == (0 if old is None and new is None else 1)


def test_foreign_key_joins_say_what_they_cannot_do() -> None:
    app = App("fk-errors")
    orders = app.table("orders", value=serdes.Json())
    customers = app.table("customers", value=serdes.Json())
    with pytest.raises(TopologyError, match="inner or left, not outer"):
        orders.join(customers, _enrich, foreign_key=_customer_of, how="outer")
    with pytest.raises(TypeError, match="foreign_key= joins two tables"):
        app.join(app.topic("events"), customers, foreign_key=_customer_of)


KEYS = ["o1", "o2", "o3"]
CUSTOMERS = ["c1", "c2", "c3"]
updates = st.lists(
    st.one_of(
        st.tuples(st.just("orders"), st.sampled_from(KEYS), st.one_of(st.none(), st.builds(lambda c: {"customer": c}, st.sampled_from([*CUSTOMERS, None])))),
        st.tuples(
            st.just("customers"), st.sampled_from(CUSTOMERS), st.one_of(st.none(), st.builds(lambda c: {"city": c}, st.sampled_from(["Oslo", "Rome", "Lima"])))
        ),
    ),
    max_size=40,
)


@pytest.mark.parametrize("how", ["inner", "left"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=updates)
def test_any_interleaving_ends_as_the_offline_join_with_no_stale_result_last(how: str, steps: list[tuple[str, str, Any]]) -> None:
    tables: dict[str, dict[str, Any]] = {"orders": {}, "customers": {}}
    with TopologyTestDriver(fk_app(how)) as driver:
        for timestamp, (topic, key, value) in enumerate(steps):
            driver.input_topic(topic).pipe_input(key, value, timestamp=timestamp)
            if value is None:
                tables[topic].pop(key, None)
            else:
                tables[topic][key] = value
        last: dict[str, Any] = {}
        for key, value in driver.output_topic("out").read_key_values():
            last[key] = value
    expected = offline(how, tables["orders"], tables["customers"])
    assert {key: value for key, value in last.items() if value is not None} == expected


class _Bytes:
    """A byte key-value store in key order: what the kernels need of one."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = value

    def range(self, key_from: bytes | None, key_to: bytes | None) -> list[tuple[bytes, bytes]]:
        return [(k, v) for k, v in sorted(self.data.items()) if (key_from is None or k >= key_from) and (key_to is None or k <= key_to)]

    def all(self) -> list[tuple[bytes, bytes]]:
        return sorted(self.data.items())

    def prefix_scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        return [(k, v) for k, v in sorted(self.data.items()) if k.startswith(prefix)]


@pytest.mark.parametrize("how", ["inner", "left"])
@settings(max_examples=150, deadline=None)
@given(data=st.data(), steps=updates)
def test_racing_answers_never_leave_a_stale_result_last(how: str, data: st.DataObject, steps: list[tuple[str, str, Any]]) -> None:
    """The kernels wired by hand, with the internal topics' records delivered in any order
    Kafka allows: per producing task and partition in order, across producers in any order.
    An answer to a left value that has changed since is then common, and the hash drops it."""
    from pystreams.topology.kernels import NodeWiring, node_emit

    topology = fk_app(how).topology()
    nodes, specs = topology.nodes, topology.stores
    stores = {name: _Bytes() for name in specs}
    registrations: dict[tuple[Any, Any], list[Any]] = {}  # (foreign key, left key) -> FIFO
    responses: dict[tuple[Any, Any], list[Any]] = {}  # (left key, foreign key) -> FIFO
    results: dict[str, Any] = {}
    pending_foreign_key: list[Any] = [None]

    def kernel(name: str, forward: Any) -> Any:
        return node_emit(nodes[name], NodeWiring(node=nodes[name], forward=forward, stores=stores, specs=specs))

    subscribe = kernel("enriched-subscribe", lambda fk_, sub, ts: registrations.setdefault((fk_, sub.primary_key), []).append((fk_, sub)))
    answer = kernel("enriched-subscriptions", lambda key, resp, ts: responses.setdefault((key, pending_foreign_key[0]), []).append(resp))
    on_right = kernel("enriched-foreign", lambda key, resp, ts: responses.setdefault((key, pending_foreign_key[0]), []).append(resp))
    join = kernel("enriched", lambda key, row, ts: results.__setitem__(key, row))
    tables: dict[str, dict[str, Any]] = {"orders": {}, "customers": {}}
    table_serde = serdes.Json()

    def deliver_one() -> None:
        queues = [(k, q) for k, q in {**{("r", *k): q for k, q in registrations.items()}, **{("s", *k): q for k, q in responses.items()}}.items() if q]
        (kind, a, b), queue = data.draw(st.sampled_from(queues))
        if kind == "r":
            foreign_key, subscription = queue.pop(0)
            pending_foreign_key[0] = foreign_key
            answer(foreign_key, subscription, 0)
        else:
            join(a, queue.pop(0), 0)

    def pending() -> bool:
        return any(registrations.values()) or any(responses.values())

    for topic, key, value in steps:
        while pending() and data.draw(st.booleans()):
            deliver_one()
        stores[topic].put(serdes.Text().serialize(key), table_serde.serialize(value))
        if value is None:
            tables[topic].pop(key, None)
        else:
            tables[topic][key] = value
        if topic == "orders":
            subscribe(key, value, 0)
        else:
            pending_foreign_key[0] = key
            on_right(key, value, 0)
    while pending():
        deliver_one()
    assert {key: row for key, row in results.items() if row is not None} == offline(how, tables["orders"], tables["customers"])


def test_a_foreign_key_join_of_two_aggregated_tables_builds_and_joins() -> None:
    """Both sides computed from repartitioned streams: the join's two topics run both ways
    between sub-topologies whose sizes come from repartition topics, not from input topics."""
    app = App("fk-aggregated")
    orders = app.topic("order-events", value=serdes.Json()).group_by(lambda key, event: event["order"]).reduce(lambda old, key, new: new, name="orders")
    cities = app.topic("moves", value=serdes.Json()).group_by(lambda key, move: move["customer"]).reduce(lambda old, key, new: new, name="cities")
    orders.join(cities, lambda key, order, move: move["city"], foreign_key=lambda key, order: order["customer"], value=serdes.Text(), store="order-cities")
    with TopologyTestDriver(app) as driver:
        driver.input_topic("moves").pipe_input(None, {"customer": "c1", "city": "Oslo"}, timestamp=1)
        driver.input_topic("order-events").pipe_input(None, {"order": "o1", "customer": "c1"}, timestamp=2)
        driver.input_topic("moves").pipe_input(None, {"customer": "c1", "city": "Rome"}, timestamp=3)
        assert driver.store_contents("order-cities") == {"o1": "Rome"}
