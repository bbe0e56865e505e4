"""Emit-final windowed aggregations (KIP-825) and ``table.suppress`` (Kafka Streams'
``Suppressed``) on the worker's kernels through the test driver: what appears when, what is
late, the buffer's limits, and the declarations refused."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pystreams.topology.errors import TopologyError
from pystreams.topology.kernels import SuppressionBufferFullError, partition_for_key
from pystreams.topology.windows import Windowed

from pystreams import serdes, until_time_limit, until_window_closes
from pystreams.app import App, HoppingWindow, Processor, SessionWindow, TumblingWindow
from pystreams.queries import QueryError
from pystreams.spark import compile_topology
from pystreams.spark.compiler import TaskPlan
from pystreams.testing import TopologyTestDriver


def count_app(window: Any, *, emit: str = "final") -> App:
    app = App("emit-final")
    clicks = app.topic("in", value=serdes.Text())
    app.count(clicks, store="counts", window=window, emit=emit).to("out")
    return app


def outputs_after_each(app: App, records: list[tuple[str, int]], *, topic: str = "out", partitions: int = 1) -> list[list[tuple[Any, Any]]]:
    """What the output topic received after each input record."""
    seen = []
    with TopologyTestDriver(app, partitions={"in": partitions}) as driver:
        source, out = driver.input_topic("in"), driver.output_topic(topic)
        for key, timestamp in records:
            source.pipe_input(key, "x", timestamp=timestamp)
            seen.append(out.read_key_values())
    return seen


# --------------------------------------------------------------------------- emit-final


def test_a_tumbling_window_emits_its_count_once_when_stream_time_passes_end_plus_grace() -> None:
    seen = outputs_after_each(
        count_app(TumblingWindow(size=10, grace=5)),
        [("a", 1), ("a", 5), ("b", 12), ("a", 14), ("a", 3), ("c", 16), ("a", 2), ("b", 40)],
    )
    assert seen == [
        [],
        [],
        [],
        [],
        [],  # a@3 at stream time 14: [0, 10) is still within its grace (closes at 15)
        [(Windowed("a", 0, 10), 3)],  # stream time 16 closed [0, 10): a@1, a@5, a@3
        [],  # a@2 is late: [0, 10) is out, and stays out
        [(Windowed("a", 10, 20), 1), (Windowed("b", 10, 20), 1), (Windowed("c", 10, 20), 1)],
    ]


def test_emit_final_hopping_windows_on_the_advance_grid_each_once() -> None:
    # size 10, advance 3 (not a multiple): t=10 is in [3,13) [6,16) [9,19)
    seen = outputs_after_each(count_app(HoppingWindow(size=10, advance=3)), [("k", 10), ("k", 12), ("k", 18), ("k", 30)])
    assert seen[:2] == [[], []]
    assert seen[2] == [(Windowed("k", 3, 13), 2), (Windowed("k", 6, 16), 2)]  # stream time 18 closed ends 13 and 16
    assert seen[3] == [(Windowed("k", 9, 19), 3), (Windowed("k", 12, 22), 2), (Windowed("k", 15, 25), 1), (Windowed("k", 18, 28), 1)]


def test_emit_final_sessions_close_at_end_plus_gap_plus_grace() -> None:
    seen = outputs_after_each(count_app(SessionWindow(gap=10, grace=5)), [("k", 0), ("k", 8), ("k", 23), ("k", 24), ("k", 39), ("k", 40)])
    assert seen == [
        [],
        [],  # [0, 0] merged into [0, 8]: never final
        [],  # stream time 23: a record at 18 would still be on time and extend [0, 8]
        [(Windowed("k", 0, 8), 2)],  # 24: [0, 8] ends before 24 - 5 - 10
        [],  # [23, 24] closes only after 24 + 10 + 5 = 39
        [(Windowed("k", 23, 24), 2)],
    ]


def test_emit_final_per_task_stream_time_on_several_partitions() -> None:
    keys = [key for key in "abcdefgh" if partition_for_key(key.encode(), 2) == 0][:1] + [key for key in "abcdefgh" if partition_for_key(key.encode(), 2) == 1][
        :1
    ]
    first, second = keys
    seen = outputs_after_each(count_app(TumblingWindow(size=10)), [(first, 1), (second, 2), (first, 15), (second, 9), (second, 20)], partitions=2)
    # first's task reached 15: its [0, 10) closed; second's task was at 2, so its late-looking
    # record at 9 is on time there, and its window closes only at its own 20.
    assert seen == [[], [], [(Windowed(first, 0, 10), 1)], [], [(Windowed(second, 0, 10), 2)]]


WINDOWS = {
    "tumbling": TumblingWindow(size=10, grace=3),
    "hopping": HoppingWindow(size=10, advance=4, grace=2),
    "session": SessionWindow(gap=5, grace=3),
}


@pytest.mark.parametrize("kind", sorted(WINDOWS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 60)), min_size=1, max_size=40))
def test_emit_final_is_the_last_update_of_each_closed_window_and_nothing_else(kind: str, records: list[tuple[str, int]]) -> None:
    """Random keys and out-of-order timestamps on two partitions: the final results are, per
    window that closed by its task's stream time, the last on-update result, once each; no
    window still open has any."""
    window = WINDOWS[kind]
    update_records: list[tuple[Any, Any]] = []
    finals: list[tuple[Any, Any]] = []
    for emit, sink in (("update", update_records), ("final", finals)):
        app = count_app(window, emit=emit)
        with TopologyTestDriver(app, partitions={"in": 2}) as driver:
            source = driver.input_topic("in")
            for key, timestamp in records:
                source.pipe_input(key, "x", timestamp=timestamp)
            sink.extend(driver.output_topic("out").read_key_values())
    updates = {windowed: count for windowed, count in update_records}
    updates = {windowed: count for windowed, count in updates.items() if count is not None}
    stream_time = {p: max((t for k, t in records if partition_for_key(k.encode(), 2) == p), default=None) for p in (0, 1)}

    def closed(windowed: Windowed) -> bool:
        now = stream_time[partition_for_key(windowed.key.encode(), 2)]
        assert now is not None
        if isinstance(window, SessionWindow):
            return windowed.end_ms < now - window.grace_ms - window.gap_ms
        return windowed.end_ms <= now - window.grace_ms

    emitted = [windowed for windowed, _ in finals]
    assert len(emitted) == len(set(emitted)), "a window's final result appeared twice"
    expected = {windowed: count for windowed, count in updates.items() if closed(windowed)}
    if not isinstance(window, SessionWindow):
        assert dict(finals) == expected
        return
    # Sessions, as Kafka Streams' session aggregate: a session closes once it ends before stream
    # time - grace - gap, yet a record at or after that close time may still bridge to it
    # (a record within the gap of its end is not late), so a session emitted as final can be
    # merged into a newer one later. Every final is then a result the session really had; every
    # session still in the table that closed is emitted with its last value.
    assert set(finals) <= set(update_records)
    assert expected.items() <= dict(finals).items()


def test_emit_final_needs_a_window_and_a_known_strategy() -> None:
    app = App("bad")
    clicks = app.topic("in")
    with pytest.raises(TopologyError, match=r"count 'totals': emit='final' needs window="):
        app.count(clicks, store="totals", emit="final")
    with pytest.raises(TopologyError, match=r"'per-minute': emit must be one of \['update', 'final'\], got 'last'"):
        app.count(clicks, store="per-minute", window=TumblingWindow(size=60_000), emit="last")


def test_emit_final_keeps_its_stream_time_in_a_store_of_its_own_not_queryable() -> None:
    topology = count_app(TumblingWindow(size=10)).topology()
    assert topology.nodes["counts"].stores == ("counts", "counts-emit-final")
    assert topology.stores["counts-emit-final"].changelog_topic == "emit-final-counts-emit-final-changelog"
    assert count_app(TumblingWindow(size=10), emit="update").topology().hash != topology.hash
    with pytest.raises(QueryError, match="'counts-emit-final' .* is not queryable: bookkeeping of node 'counts'"):
        count_app(TumblingWindow(size=10)).query("counts-emit-final", "a", endpoints="127.0.0.1:1")


def test_the_window_store_of_an_emit_final_count_stays_readable() -> None:
    with TopologyTestDriver(count_app(TumblingWindow(size=10, grace=5))) as driver:
        source = driver.input_topic("in")
        for key, timestamp in [("a", 1), ("a", 4), ("b", 11)]:
            source.pipe_input(key, "x", timestamp=timestamp)
        assert driver.output_topic("out").is_empty
        assert driver.store_contents("counts") == {("a", 0): 2, ("b", 10): 1}


# --------------------------------------------------------------------------- suppress


def suppressed_app(suppression: Any, *, window: Any = None) -> App:
    app = App("suppressed")
    clicks = app.topic("in", value=serdes.Text())
    counts = app.count(clicks, store="counts", window=window)
    counts.suppress(suppression, name="held").to("out")
    return app


def test_until_window_closes_emits_each_windows_final_count_once() -> None:
    seen = outputs_after_each(
        suppressed_app(until_window_closes(), window=TumblingWindow(size=10, grace=5)),
        [("a", 1), ("a", 5), ("b", 12), ("a", 14), ("a", 3), ("c", 16), ("a", 2), ("b", 40)],
    )
    assert seen == [[], [], [], [], [], [(Windowed("a", 0, 10), 3)], [], [(Windowed("b", 10, 20), 1), (Windowed("a", 10, 20), 1), (Windowed("c", 10, 20), 1)]]


class Unbatch(Processor):
    """Forwards each ``[user, timestamp]`` of a batch record as a click at its own timestamp."""

    def process(self, key: Any, value: Any) -> None:
        for user, timestamp in value:
            self.context.forward(user, "click", timestamp=timestamp)


def test_until_window_closes_emits_once_when_one_commit_flushes_several_records_updates() -> None:
    # The batches go through a repartition topic, whose records the driver processes all
    # before it commits: the counting task then flushes several records' updates at once, as a
    # worker commits a poll's worth. Flushed in write order, each update must carry its own
    # record's timestamp (Kafka Streams' cache): stamped with the stream time at the commit, b's
    # update would move the suppression's stream time to 12 before a's newer count arrived,
    # emitting a's older count and then its newer one.
    app = App("suppressed-batches")
    batches = app.topic("batches", value=serdes.Json())
    clicks = app.processor(batches, value=serdes.Text(), key=serdes.Text(), name="unbatch")(Unbatch)
    counts = app.count(clicks, store="counts", window=TumblingWindow(size=10))
    counts.suppress(until_window_closes(), name="held").to("out")
    with TopologyTestDriver(app) as driver:
        source, out = driver.input_topic("batches"), driver.output_topic("out")
        source.pipe_input(None, [["a", 1]], timestamp=1)
        assert out.read_records() == []
        source.pipe_input(None, [["b", 2], ["a", 3], ["c", 12]], timestamp=12)
        assert [(r.key, r.value, r.timestamp) for r in out.read_records()] == [(Windowed("a", 0, 10), 2, 3), (Windowed("b", 0, 10), 1, 2)]


def test_until_window_closes_on_sessions_waits_for_gap_and_grace() -> None:
    seen = outputs_after_each(
        suppressed_app(until_window_closes(), window=SessionWindow(gap=10, grace=5)), [("k", 0), ("k", 8), ("k", 23), ("k", 24), ("k", 40)]
    )
    # [0, 0] merged into [0, 8] before it closed: its deletion is not emitted (it never was)
    assert seen == [[], [], [], [(Windowed("k", 0, 8), 2)], [(Windowed("k", 23, 24), 2)]]


def test_until_time_limit_holds_each_key_from_its_first_update_non_resetting() -> None:
    seen = outputs_after_each(suppressed_app(until_time_limit(10)), [("a", 0), ("a", 6), ("b", 9), ("a", 10), ("b", 19), ("c", 30)])
    assert seen == [
        [],
        [],  # a's second update replaces the first and keeps its place: due at 0 + 10
        [],
        [("a", 3)],  # stream time 10: a is due, with its latest count
        [("b", 2)],  # b was first buffered at 9: due at 19
        [],  # c@30 is buffered until 40; nothing else is held
    ]


def test_until_time_limit_emits_the_oldest_early_when_the_buffer_is_full() -> None:
    seen = outputs_after_each(suppressed_app(until_time_limit(1_000, max_records=2)), [("a", 0), ("b", 1), ("a", 2), ("c", 3), ("d", 4)])
    assert seen == [[], [], [], [("a", 2)], [("b", 1)]]


def test_a_full_shut_down_buffer_stops_the_task_naming_store_limit_and_setting() -> None:
    app = App("suppressed", processing_errors="log-and-continue")  # not a record's fault: no policy skips it
    clicks = app.topic("in", value=serdes.Text())
    app.count(clicks, store="counts").suppress(until_time_limit(1_000, max_records=1, when_full="shut_down"), name="held").to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        source.pipe_input("a", "x", timestamp=0)
        with pytest.raises(SuppressionBufferFullError) as raised:
            source.pipe_input("b", "x", timestamp=1)
    message = str(raised.value)
    assert "node 'held'" in message
    assert "store 'held-buffer' is full (2 records, over max_records=1)" in message
    assert "when_full is shut_down; raise the limit in until_time_limit(..., max_records=..., max_bytes=...), or when_full='emit_early'" in message


def test_max_bytes_counts_serialized_keys_and_values() -> None:
    # each buffered count: key 1 byte + Int value 8 bytes + 8 bytes of timestamp = 17
    seen = outputs_after_each(suppressed_app(until_time_limit(1_000, max_bytes=34)), [("a", 0), ("b", 1), ("c", 2)])
    assert seen == [[], [], [("a", 1)]]


def test_suppress_declarations_refused_with_the_node() -> None:
    app = App("bad")
    clicks = app.topic("in")
    plain = app.count(clicks, store="totals")
    with pytest.raises(TopologyError, match="suppress 'totals-suppress': until_window_closes\\(\\) needs a windowed table, but 'totals' has no windows"):
        plain.suppress(until_window_closes())
    with pytest.raises(ValueError, match=r"until_time_limit: when_full must be one of \['emit_early', 'shut_down'\], got 'drop'"):
        until_time_limit(10, when_full="drop")
    with pytest.raises(ValueError, match="until_time_limit: max_records must be a positive int or None, got 0"):
        until_time_limit(10, max_records=0)
    with pytest.raises(ValueError, match="until_time_limit duration must be >= 0 ms, got -1"):
        until_time_limit(-1)
    with pytest.raises(TypeError, match="give until_window_closes\\(\\) or until_time_limit"):
        plain.suppress(10)  # type: ignore[arg-type]


def test_suppression_buffers_are_not_queryable() -> None:
    app = suppressed_app(until_time_limit(10))
    with pytest.raises(QueryError, match="'held-buffer' .* is not queryable: the suppression buffer of 'held'"):
        app.query("held-buffer", "a", endpoints="127.0.0.1:1")


def test_spark_runs_emit_final_in_one_query_and_suppress_in_its_sub_topologys_query() -> None:
    plan = compile_topology(count_app(TumblingWindow(size=10)).topology())
    assert plan.stateful_nodes == ("counts",)
    task_plan = plan.sinks[0].input.base
    assert isinstance(task_plan, TaskPlan)
    assert [store.name for store in task_plan.step.stores] == ["counts", "counts-emit-final"]
    assert task_plan.step.table is None  # the kernel forwards each final result, not the store's changes
    # A suppression is a second stateful step: the sub-topology runs per task, its buffer in
    # Spark state (tests/test_spark_kernels_properties.py checks what it emits).
    (query,) = compile_topology(suppressed_app(until_time_limit(10)).topology()).chained
    assert {node.name for node in query.step.nodes} >= {"counts", "held"}
    assert "held-buffer" in {store.name for store in query.step.stores}


def test_until_window_closes_over_sliding_windows_emits_the_last_update_of_each_closed_window_once() -> None:
    from pystreams.app import SlidingWindow

    def app_of(suppressed: bool) -> App:
        app = App("sliding-suppressed")
        clicks = app.topic("in", value=serdes.Text())
        counts = app.count(clicks, store="recent", window=SlidingWindow(difference=10, grace=2))
        (counts.suppress(until_window_closes()) if suppressed else counts).to("out")
        return app

    records = [("k", 0), ("k", 5), ("k", 9), ("k", 14), ("j", 3), ("k", 40)]
    results = {}
    for suppressed in (False, True):
        with TopologyTestDriver(app_of(suppressed)) as driver:
            source = driver.input_topic("in")
            for key, timestamp in records:
                source.pipe_input(key, "x", timestamp=timestamp)
            results[suppressed] = driver.output_topic("out").read_key_values()
    last_update = dict(results[False])
    # A sliding window's end is inclusive: closed once end + grace is before stream time (40).
    closed = {windowed: count for windowed, count in last_update.items() if windowed.end_ms + 2 < 40}
    assert closed and len(closed) < len(last_update)
    assert sorted(results[True], key=repr) == sorted(closed.items(), key=repr)


def test_emit_final_over_sliding_windows_is_refused_naming_the_node() -> None:
    from pystreams.app import SlidingWindow

    app = App("sliding-final")
    clicks = app.topic("in", value=serdes.Text())
    with pytest.raises(TopologyError, match="emit='final' is not supported over sliding windows"):
        app.count(clicks, store="recent", window=SlidingWindow(difference=10), emit="final")
