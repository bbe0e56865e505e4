"""Admin tooling against a real coordinator: kafka-python's ``KafkaAdminClient.describe_groups``
(the classic DescribeGroups API) on a KIP-848 group, and the ``pystreams groups`` / ``pystreams
configs`` commands run as real subprocesses (``python -m pystreams ...``).

The coordinator runs in this process on the memory log, served over TCP by the real
``KafkaProtocolServer`` from an event loop in a background thread; its topic metadata is a
fixed image with one topic. Groups are formed by KIP-848 heartbeats sent with
``pystreams.protocol.client.KafkaProtocolClient``. Every wait is bounded; the coordinator is
stopped and every subprocess ends (or is killed) before a test returns.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import kafka.errors as Errors
import pytest
from kafka.admin import KafkaAdminClient
from pystreams.assignors.api import TopicMetadata

from pystreams.coordinator.config import HEARTBEAT_INTERVAL, SESSION_TIMEOUT, CoordinatorConfig
from pystreams.coordinator.log import MemoryLog
from pystreams.coordinator.runtime import Coordinator, StaticTopics
from pystreams.protocol import messages as m
from pystreams.protocol.client import KafkaProtocolClient
from pystreams.protocol.server import KafkaProtocolServer

GUARD_S = 20.0
PARTITIONS = 6
FOO = TopicMetadata(uuid.UUID(int=0xF00), "foo", PARTITIONS)
CONFIG = CoordinatorConfig(
    session_timeout_ms=30_000,
    min_session_timeout_ms=1_000,
    max_session_timeout_ms=60_000,
    heartbeat_interval_ms=500,
    min_heartbeat_interval_ms=100,
    max_heartbeat_interval_ms=2_000,
)
HB = m.ConsumerGroupHeartbeatRequest


# --- an in-process coordinator ---------------------------------------------------------------------


@dataclass
class RunningCoordinator:
    loop: asyncio.AbstractEventLoop
    coordinator: Coordinator
    server: KafkaProtocolServer

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def client(self) -> KafkaProtocolClient:
        return KafkaProtocolClient("127.0.0.1", self.server.port, client_id="admin-tools-test", timeout_s=GUARD_S).connect()


@pytest.fixture(scope="module")
def coordinator() -> Iterator[RunningCoordinator]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="admin-tools-coordinator", daemon=True)
    thread.start()

    async def start() -> RunningCoordinator:
        running = Coordinator(MemoryLog(3), config=CONFIG, topic_source=StaticTopics({"foo": FOO}))
        await running.start()
        await running.wait_until_loaded()
        server = KafkaProtocolServer("127.0.0.1", 0, running.handle)
        await server.start()
        return RunningCoordinator(loop, running, server)

    running = asyncio.run_coroutine_threadsafe(start(), loop).result(GUARD_S)
    try:
        yield running
    finally:

        async def stop() -> None:
            await running.coordinator.close()
            await running.server.close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(GUARD_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(GUARD_S)
        loop.close()


def unique_group(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


# --- KIP-848 members driven by heartbeats ----------------------------------------------------------


@dataclass
class Member:
    member_id: str = ""
    epoch: int = 0
    owned: dict[uuid.UUID, list[int]] = field(default_factory=dict)

    def partitions(self) -> set[int]:
        return {p for partitions in self.owned.values() for p in partitions}


def form_stable_group(client: KafkaProtocolClient, group_id: str, size: int) -> list[Member]:
    """``size`` members join ``group_id`` and heartbeat (acknowledging what they own) until the
    coordinator says the group is Stable."""
    members = [Member() for _ in range(size)]
    for member in members:
        _heartbeat(client, group_id, member, join=True)
    for _ in range(50):
        for member in members:
            _heartbeat(client, group_id, member)
        (described,) = client.send(m.ConsumerGroupDescribeRequest(group_ids=[group_id], include_authorized_operations=False)).groups
        if described.group_state == "Stable":
            return members
    raise AssertionError(f"group {group_id} did not become Stable: {described}")


def _heartbeat(client: KafkaProtocolClient, group_id: str, member: Member, join: bool = False) -> None:
    if join:
        request = HB(group_id=group_id, member_id="", member_epoch=0, rebalance_timeout_ms=5_000, subscribed_topic_names=["foo"], topic_partitions=[])
    else:
        request = HB(
            group_id=group_id,
            member_id=member.member_id,
            member_epoch=member.epoch,
            rebalance_timeout_ms=-1,
            topic_partitions=[HB.TopicPartitions(topic_id=t, partitions=ps) for t, ps in member.owned.items()],
        )
    response = client.send(request)
    assert response.error_code == 0, response
    member.member_id, member.epoch = response.member_id, response.member_epoch
    if response.assignment is not None:
        member.owned = {t.topic_id: sorted(t.partitions) for t in response.assignment.assigned_topic_partitions}


# --- subprocesses -----------------------------------------------------------------------------------


def pystreams(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m pystreams ARGS``; killed (and the test failed) if it outlives GUARD_S."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pystreams", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {}))
    )
    try:
        stdout, stderr = process.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise AssertionError(f"pystreams {' '.join(args)} did not finish within {GUARD_S} s") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def table_rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.strip()]


# --- DescribeGroups through kafka-python's admin client ----------------------------------------------


def test_kafka_python_admin_describes_a_kip848_group(coordinator: RunningCoordinator) -> None:
    group_id = unique_group("described")
    with coordinator.client() as client:
        members = form_stable_group(client, group_id, size=2)
    admin = KafkaAdminClient(bootstrap_servers=coordinator.address, client_id="admin-tools-test", request_timeout_ms=int(GUARD_S * 1000))
    try:
        described = admin.describe_groups([group_id, "no-such-group"])
    finally:
        admin.close()

    group = described[group_id]
    assert group["error"] is None
    assert group["group_state"] == "Stable"
    assert group["protocol_type"] == "consumer"
    assert group["protocol_data"] == CONFIG.assignors[0]  # no member named an assignor: the default
    by_id = {member["member_id"]: member for member in group["members"]}
    assert set(by_id) == {member.member_id for member in members}
    for member in members:
        described_member = by_id[member.member_id]
        assert described_member["client_id"] == "admin-tools-test"
        assert described_member["client_host"] == "127.0.0.1"
        assert described_member["group_instance_id"] is None
        assert described_member["member_metadata"]["topics"] == ["foo"]
        assignment = described_member["member_assignment"]["assigned_partitions"]
        assert [entry["topic"] for entry in assignment] == ["foo"]
        assert set(assignment[0]["partitions"]) == member.partitions() != set()
    # Between them the members own every partition, each once.
    owned = [p for m_ in group["members"] for entry in m_["member_assignment"]["assigned_partitions"] for p in entry["partitions"]]
    assert sorted(owned) == list(range(PARTITIONS))

    missing = described["no-such-group"]
    assert missing["group_state"] == "Dead"
    assert missing["members"] == []
    assert "GroupIdNotFound" in missing["error"]  # DescribeGroups v6 (KIP-1043); older versions: no error


def test_describe_groups_before_v6_reports_a_missing_group_as_dead_without_error(coordinator: RunningCoordinator) -> None:
    group_id = unique_group("old-client")
    with coordinator.client() as client:
        members = form_stable_group(client, group_id, size=1)
        response = client.send(m.DescribeGroupsRequest(groups=["no-such-group", group_id]), version=5)
    missing, present = response.groups
    assert (missing.group_id, missing.error_code, missing.group_state, missing.members) == ("no-such-group", 0, "Dead", [])
    assert (present.group_id, present.error_code, present.group_state) == (group_id, 0, "Stable")
    assert [member.member_id for member in present.members] == [members[0].member_id]


def test_describe_groups_mid_reconciliation_shows_what_members_hold_not_what_they_revoke(coordinator: RunningCoordinator) -> None:
    group_id = unique_group("reconciling")
    first, second = Member(), Member()
    with coordinator.client() as client:
        _heartbeat(client, group_id, first, join=True)
        _heartbeat(client, group_id, first)  # acknowledges all six partitions
        assert first.partitions() == set(range(PARTITIONS))
        _heartbeat(client, group_id, second, join=True)
        _heartbeat(client, group_id, first)  # told to give half away; not acknowledged yet
        kept = first.partitions()
        assert 0 < len(kept) < PARTITIONS
        (group,) = client.send(m.DescribeGroupsRequest(groups=[group_id])).groups

    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment

    assert group.group_state == "Reconciling"
    held = {member.member_id: ConsumerProtocolAssignment.decode(member.member_assignment).assigned_partitions for member in group.members}
    # As Kafka: the member assignment is the partitions a member may consume (revoking ones excluded).
    assert [(t.topic, sorted(t.partitions)) for t in held[first.member_id]] == [("foo", sorted(kept))]
    assert held[second.member_id] == []


def test_describe_groups_spanning_shards_keeps_request_order(coordinator: RunningCoordinator) -> None:
    group_ids = [unique_group(f"order{i}") for i in range(6)]
    with coordinator.client() as client:
        for group_id in group_ids[::2]:
            form_stable_group(client, group_id, size=1)
        response = client.send(m.DescribeGroupsRequest(groups=group_ids))
    assert len({coordinator.coordinator.shard_for(g) for g in group_ids}) > 1, "the test needs groups on several shards"
    assert [group.group_id for group in response.groups] == group_ids
    assert [group.group_state for group in response.groups] == ["Stable", "Dead"] * 3


# --- pystreams groups --------------------------------------------------------------------------------


def test_groups_list_prints_rows_and_filters(coordinator: RunningCoordinator) -> None:
    stable = unique_group("listed")
    with coordinator.client() as client:
        form_stable_group(client, stable, size=1)

    listed = pystreams("groups", "--coordinator", coordinator.address, "--list")
    assert listed.returncode == 0, listed.stderr
    rows = table_rows(listed.stdout)
    assert rows[0] == ["GROUP", "TYPE", "STATE", "PROTOCOL-TYPE"]
    assert [stable, "consumer", "Stable", "consumer"] in rows[1:]

    as_json = pystreams("groups", "--list", "--json", "--type", "consumer", "--state", "Stable", env={"PYSTREAMS_COORDINATOR": coordinator.address})
    assert as_json.returncode == 0, as_json.stderr
    groups = json.loads(as_json.stdout)
    assert {"group_id": stable, "group_type": "consumer", "group_state": "Stable", "protocol_type": "consumer"} in groups
    assert all(group["group_state"] == "Stable" for group in groups)

    none_match = pystreams("groups", "--coordinator", coordinator.address, "--list", "--json", "--state", "Empty")
    assert none_match.returncode == 0, none_match.stderr
    assert stable not in {group["group_id"] for group in json.loads(none_match.stdout)}

    bad_type = pystreams("groups", "--coordinator", coordinator.address, "--list", "--type", "share-ish")
    assert bad_type.returncode == 2
    assert "unknown group type share-ish" in bad_type.stderr


def test_groups_describe_prints_members_epochs_and_assignments(coordinator: RunningCoordinator) -> None:
    group_id = unique_group("desc")
    with coordinator.client() as client:
        members = form_stable_group(client, group_id, size=2)

    described = pystreams("groups", "--coordinator", coordinator.address, "--describe", group_id)
    assert described.returncode == 0, described.stderr
    rows = table_rows(described.stdout)
    assert rows[0] == ["GROUP", "TYPE", "STATE", "GROUP-EPOCH", "ASSIGNMENT-EPOCH", "ASSIGNOR", "MEMBERS"]
    assert rows[1] == [group_id, "consumer", "Stable", "2", "2", CONFIG.assignors[0], "2"]
    assert rows[2] == ["MEMBER-ID", "INSTANCE-ID", "CLIENT-ID", "HOST", "PROTOCOL", "EPOCH", "SUBSCRIPTION", "ASSIGNMENT", "TARGET-ASSIGNMENT"]
    member_rows = {row[0]: row for row in rows[3:]}
    assert set(member_rows) == {member.member_id for member in members}
    for member in members:
        partitions = sorted(member.partitions())
        expected = f"foo:{partitions[0]}-{partitions[-1]}"  # the uniform assignor hands out ranges
        assert member_rows[member.member_id][1:] == ["-", "admin-tools-test", "127.0.0.1", "consumer", "2", "foo", expected, expected]

    as_json = pystreams("groups", "--coordinator", coordinator.address, "--describe", group_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert (document["group_id"], document["group_type"], document["group_state"], document["group_epoch"], document["assignor"]) == (
        group_id,
        "consumer",
        "Stable",
        2,
        CONFIG.assignors[0],
    )
    by_id = {member["member_id"]: member for member in document["members"]}
    for member in members:
        assert by_id[member.member_id]["assignment"] == {"foo": sorted(member.partitions())}
        assert by_id[member.member_id]["target_assignment"] == {"foo": sorted(member.partitions())}
        assert by_id[member.member_id]["member_epoch"] == member.epoch

    missing = pystreams("groups", "--coordinator", coordinator.address, "--describe", "no-such-group")
    assert missing.returncode == 1
    assert "GROUP_ID_NOT_FOUND" in missing.stderr


def test_groups_validate_regex_uses_re2_rules_offline() -> None:
    # No coordinator listens at this address: validation must not need one.
    offline = {"PYSTREAMS_COORDINATOR": "127.0.0.1:1"}
    valid = pystreams("groups", "--validate-regex", "orders-.*", env=offline)
    assert valid.returncode == 0, valid.stderr
    assert valid.stdout.startswith("valid:")

    invalid = pystreams("groups", "--validate-regex", "orders-(", env=offline)
    assert invalid.returncode == 1
    assert "is not a valid RE2 regular expression" in invalid.stderr and "missing )" in invalid.stderr

    # A look-ahead is fine for Python's re but not for RE2: the coordinator's dialect decides.
    lookahead = pystreams("groups", "--validate-regex", "(?=orders).*", "--json", env=offline)
    assert lookahead.returncode == 1
    document = json.loads(lookahead.stdout)
    assert document["valid"] is False and "RE2" in document["error"]


def test_groups_reports_an_unreachable_coordinator() -> None:
    result = pystreams("groups", "--coordinator", "127.0.0.1:1", "--list")
    assert result.returncode == 1
    assert "cannot connect to 127.0.0.1:1" in result.stderr


# --- pystreams configs -------------------------------------------------------------------------------


def _configs_json(coordinator: RunningCoordinator, group_id: str) -> dict[str, dict]:
    result = pystreams("configs", "--coordinator", coordinator.address, "--group", group_id, "--describe", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["group"] == group_id
    return {entry["name"]: entry for entry in document["configs"]}


def test_configs_describe_alter_and_delete(coordinator: RunningCoordinator) -> None:
    group_id = unique_group("configured")
    described = pystreams("configs", "--coordinator", coordinator.address, "--group", group_id, "--describe")
    assert described.returncode == 0, described.stderr
    rows = table_rows(described.stdout)
    assert rows[1] == ["NAME", "VALUE", "SOURCE"]
    assert [HEARTBEAT_INTERVAL, str(CONFIG.heartbeat_interval_ms), "DEFAULT"] in rows
    assert [SESSION_TIMEOUT, str(CONFIG.session_timeout_ms), "DEFAULT"] in rows

    altered = pystreams(
        "configs", "--coordinator", coordinator.address, "--group", group_id, "--alter", f"{SESSION_TIMEOUT}=20000", f"{HEARTBEAT_INTERVAL}=1000"
    )
    assert altered.returncode == 0, altered.stderr
    assert f"set {SESSION_TIMEOUT}=20000" in altered.stdout
    configs = _configs_json(coordinator, group_id)
    assert (configs[SESSION_TIMEOUT]["value"], configs[SESSION_TIMEOUT]["source"]) == ("20000", "GROUP_CONFIG")
    assert (configs[HEARTBEAT_INTERVAL]["value"], configs[HEARTBEAT_INTERVAL]["source"]) == ("1000", "GROUP_CONFIG")

    deleted = pystreams("configs", "--coordinator", coordinator.address, "--group", group_id, "--alter", f"{SESSION_TIMEOUT}=", "--json")
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout) == {"group": group_id, "ok": True, "set": {}, "deleted": [SESSION_TIMEOUT]}
    configs = _configs_json(coordinator, group_id)
    assert (configs[SESSION_TIMEOUT]["value"], configs[SESSION_TIMEOUT]["source"]) == (str(CONFIG.session_timeout_ms), "DEFAULT")
    assert configs[HEARTBEAT_INTERVAL]["value"] == "1000"


def test_configs_alter_outside_bounds_prints_the_coordinators_error(coordinator: RunningCoordinator) -> None:
    group_id = unique_group("bounded")
    too_long = CONFIG.max_heartbeat_interval_ms + 1
    result = pystreams("configs", "--coordinator", coordinator.address, "--group", group_id, "--alter", f"{HEARTBEAT_INTERVAL}={too_long}")
    assert result.returncode == 1
    assert Errors.InvalidConfigurationError.message in result.stderr
    assert f"{HEARTBEAT_INTERVAL}={too_long} is outside the coordinator's bounds" in result.stderr
    # Nothing changed.
    assert _configs_json(coordinator, group_id)[HEARTBEAT_INTERVAL]["source"] == "DEFAULT"

    unknown = pystreams("configs", "--coordinator", coordinator.address, "--group", group_id, "--alter", "no.such.config=1")
    assert unknown.returncode == 1
    assert "unknown group config 'no.such.config'" in unknown.stderr

    malformed = pystreams("configs", "--coordinator", coordinator.address, "--group", group_id, "--alter", "novalue")
    assert malformed.returncode == 2
    assert "expected KEY=VALUE" in malformed.stderr


def test_configs_report_which_values_are_defaults(coordinator: RunningCoordinator) -> None:
    group_id = unique_group("defaults")
    assert pystreams("configs", "--coordinator", coordinator.address, "--group", group_id, "--alter", f"{HEARTBEAT_INTERVAL}=1000").returncode == 0
    configs = _configs_json(coordinator, group_id)
    assert configs[SESSION_TIMEOUT]["is_default"] is True
    assert configs[HEARTBEAT_INTERVAL]["is_default"] is False


def test_configs_alter_refuses_numbers_kafka_would_not_read(coordinator: RunningCoordinator) -> None:
    group_id = unique_group("strict")
    for text in ("5_0000", "٣٠٠٠٠", "30000.0"):
        result = pystreams("configs", "--coordinator", coordinator.address, "--group", group_id, "--alter", f"{SESSION_TIMEOUT}={text}")
        assert result.returncode == 1, result
        assert "must be an integer" in result.stderr
    assert _configs_json(coordinator, group_id)[SESSION_TIMEOUT]["source"] == "DEFAULT"
    flag = pystreams("coordinator", "--log", "memory", "--session-timeout-ms", "5_0000")
    assert flag.returncode == 2 and "not an integer: '5_0000'" in flag.stderr


def test_groups_output_escapes_what_clients_chose(coordinator: RunningCoordinator) -> None:
    forged = "evil\n" + unique_group("x") + "  Stable  consumer\x1b[2J"
    with coordinator.client() as client:
        form_stable_group(client, forged, 1)
    listed = pystreams("groups", "--coordinator", coordinator.address, "--list")
    assert listed.returncode == 0, listed.stderr
    assert "\x1b" not in listed.stdout and "evil\\n" in listed.stdout and "\\x1b[2J" in listed.stdout
    assert not any(line.startswith(forged.split("\n")[1]) for line in listed.stdout.splitlines())  # no forged row
    described = pystreams("groups", "--coordinator", coordinator.address, "--describe", forged)
    assert described.returncode == 0, described.stderr
    assert "\x1b" not in described.stdout and described.stdout.count("\n") == len(described.stdout.splitlines())
