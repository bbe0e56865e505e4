"""``pystreams groups``: list and describe the coordinator's groups, and check a regex subscription.

* ``--list [--type consumer,classic] [--state stable,empty]`` — ListGroups;
* ``--describe GROUP`` — the group's type and state, and every member with its protocol,
  subscription and assignment: a consumer (KIP-848) group through ConsumerGroupDescribe (epochs,
  assignor, current and target assignments; during an online migration each member's protocol,
  ``classic`` or ``consumer``, from v1's MemberType), a classic group through DescribeGroups
  (protocol, and each member's embedded subscription and assignment), as Kafka's admin client
  falls back from the one to the other;
* ``--validate-regex PATTERN`` — the RE2 rules the coordinator applies to
  ``SubscribedTopicRegex``; works offline.

Tables by default, ``--json`` for scripts. ``--coordinator`` may come from
``PYSTREAMS_COORDINATOR``. Exit status: 0 ok, 1 the coordinator (or the regex) said no, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pystreams.commands import options

HELP = "list and describe groups on a coordinator; validate a regex subscription"

COORDINATOR_ENV = "PYSTREAMS_COORDINATOR"
DEFAULT_COORDINATOR = "127.0.0.1:9093"
GROUP_TYPES = ("consumer", "classic")
GROUP_STATES = ("empty", "assigning", "reconciling", "stable", "dead", "preparingrebalance", "completingrebalance")  # the last two are classic groups'
#: ConsumerGroupDescribe v1's MemberType (KAFKA-17750): how each member speaks to the group.
MEMBER_TYPES = {-1: "unknown", 0: "classic", 1: "consumer"}


# --- shared with ``pystreams configs`` ----------------------------------------------------------


def add_coordinator_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--coordinator",
        metavar="HOST:PORT[,HOST:PORT...]",
        default=os.environ.get(COORDINATOR_ENV, DEFAULT_COORDINATOR),
        help=f"the pystreams coordinator to ask, or several nodes of a cluster: the tools ask the node that owns the group "
        f"(FindCoordinator), and --list asks every node (default: {DEFAULT_COORDINATOR}, env {COORDINATOR_ENV})",
    )
    parser.add_argument("--timeout-s", type=float, default=10.0, metavar="S", help="give up on a connection or an answer after this long (default: 10)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    options.add_client_security_options(parser)


def parse_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"--coordinator must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def connect(args: argparse.Namespace, *, group: str | None = None):
    """A connected ``KafkaProtocolClient`` (raises ValueError / ProtocolClientError): to the
    first node of ``--coordinator`` that answers, or with ``group`` to the node that coordinates
    it, as FindCoordinator on those nodes names it (a coordinator cluster)."""
    from pystreams.protocol.client import KafkaProtocolClient, ProtocolClientError

    addresses = [parse_host_port(text) for text in args.coordinator.split(",") if text.strip()]
    if not addresses:
        raise ValueError("--coordinator names no HOST:PORT")
    security = options.client_security_from_args(args)

    def client_for(host: str, port: int) -> KafkaProtocolClient:
        return KafkaProtocolClient(host, port, client_id="pystreams-cli", timeout_s=args.timeout_s, security=security).connect()

    failures: list[str] = []
    for host, port in addresses:
        try:
            client = client_for(host, port)
        except ProtocolClientError as error:
            failures.append(str(error))
            continue
        if group is None:
            return client
        try:
            owner = _owner_of(client, group)
            here = not isinstance(owner, str) and owner[0] == this_node(client)[0]
        except ProtocolClientError as error:
            client.close()
            failures.append(str(error))
            continue
        if isinstance(owner, str):
            failures.append(f"{host}:{port}: {owner}")
            client.close()
            continue
        if here:
            return client  # known by id: its advertised address may not be reachable from here (a port-forward)
        node_id, owner_address = owner
        client.close()
        try:
            return client_for(*owner_address)
        except ProtocolClientError as error:
            failures.append(f"{owner_address[0]}:{owner_address[1]} (named by {host}:{port}): {error}")
    raise ProtocolClientError("; ".join(failures))


def _owner_of(client, group: str) -> tuple[int, tuple[str, int]] | str:
    """The node (id, address) FindCoordinator on ``client`` names for ``group``, or why none."""
    from kafka.protocol.metadata.find_coordinator import CoordinatorType

    from pystreams.protocol import messages as m

    response = client.send(m.FindCoordinatorRequest(key_type=CoordinatorType.GROUP, coordinator_keys=[group]), 4)
    (entry,) = response.coordinators
    if entry.error_code:
        return error_text(entry.error_code, entry.error_message)
    return entry.node_id, (entry.host, entry.port)


def this_node(client) -> tuple[int, dict[int, tuple[str, int]]]:
    """From Metadata on ``client``: its own node id (a coordinator names itself the controller)
    and every coordinator node by id (one, unless it is a cluster)."""
    from pystreams.protocol import messages as m

    response = client.send(m.MetadataRequest(topics=[]))
    return response.controller_id, {broker.node_id: (broker.host, broker.port) for broker in response.brokers}


def error_text(code: int, message: str | None) -> str:
    import kafka.errors as Errors

    name = Errors.for_code(code).message if code else "NONE"
    return f"{name}: {message}" if message else name


def shown(text: str) -> str:
    """Text a client chose (group ids, member ids, hosts), safe for a terminal: control and other
    unprintable characters are escaped, so they can neither forge table rows nor move the cursor."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii") for c in text)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], out=None) -> None:
    out = out or sys.stdout
    text_rows = [["" if cell is None else shown(str(cell)) for cell in row] for row in rows]
    widths = [max([len(header)] + [len(row[i]) for row in text_rows]) for i, header in enumerate(headers)]
    for row in [list(headers)] + text_rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), file=out)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def fail(command: str, message: str, status: int = 1) -> int:
    print(f"pystreams {command}: {shown(message)}", file=sys.stderr)
    return status


# --- the command --------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="list the groups (ListGroups)")
    action.add_argument("--describe", metavar="GROUP", help="describe a consumer group (ConsumerGroupDescribe)")
    action.add_argument("--validate-regex", metavar="PATTERN", help="check a SubscribedTopicRegex with the coordinator's RE2 rules (no coordinator needed)")
    parser.add_argument("--type", metavar="TYPES", help=f"with --list: comma-separated group types ({', '.join(GROUP_TYPES)})")
    parser.add_argument("--state", metavar="STATES", help="with --list: comma-separated states (Empty, Assigning, Reconciling, Stable, ...)")
    add_coordinator_option(parser)


def _csv(text: str | None, allowed: Sequence[str], what: str) -> list[str]:
    values = [value.strip() for value in (text or "").split(",") if value.strip()]
    unknown = [value for value in values if value.lower() not in allowed]
    if unknown:
        raise ValueError(f"unknown {what} {', '.join(unknown)} (expected {', '.join(allowed)})")
    return values


def run(args: argparse.Namespace) -> int:
    if args.validate_regex is not None:
        return _validate_regex(args)
    if not args.list and (args.type or args.state):
        return fail("groups", "--type and --state go with --list", 2)
    from pystreams.protocol.client import ProtocolClientError

    try:
        with connect(args, group=None if args.list else args.describe) as client:
            if args.list:
                return _list(args, client)
            return _describe(args, client)
    except ValueError as error:
        return fail("groups", str(error), 2)
    except ProtocolClientError as error:
        return fail("groups", str(error))


def _validate_regex(args: argparse.Namespace) -> int:
    from pystreams.coordinator.subscriptions import InvalidRegex, validate_regex

    pattern = args.validate_regex
    try:
        validate_regex(pattern)
    except InvalidRegex as error:
        if args.json:
            print_json({"pattern": pattern, "valid": False, "error": str(error)})
        else:
            print(f"invalid: {error}", file=sys.stderr)
        return 1
    if args.json:
        print_json({"pattern": pattern, "valid": True, "error": None})
    else:
        print(f"valid: {pattern!r} is a valid RE2 regular expression (it must match whole topic names; internal topics starting with '__' never match)")
    return 0


def _list(args: argparse.Namespace, client) -> int:
    from pystreams.protocol import messages as m

    types = [value.lower() for value in _csv(args.type, GROUP_TYPES, "group type")]
    states = _csv(args.state, GROUP_STATES, "group state")
    from pystreams.protocol.client import KafkaProtocolClient, ProtocolClientError

    # A node lists the groups of the shards it serves (Kafka's ListGroups is per broker too):
    # ask every node Metadata lists, as Kafka's admin client does. A node that does not answer
    # is said, and the list is then partial (exit status 1).
    listed: dict[str, Any] = {}
    missing: list[str] = []
    me, nodes = this_node(client)
    for node_id, (host, port) in sorted(nodes.items()):
        node = client if node_id == me else KafkaProtocolClient(host, port, client_id="pystreams-cli", timeout_s=client.timeout_s, security=client.security)
        try:
            response = node.send(m.ListGroupsRequest(states_filter=states, types_filter=types))
        except ProtocolClientError as error:
            missing.append(f"node {node_id} ({error})")
            continue
        finally:
            if node is not client:
                node.close()
        if response.error_code:
            missing.append(f"node {node_id} at {host}:{port}: {error_text(response.error_code, None)}")
            continue
        listed.update((group.group_id, group) for group in response.groups or [])
    groups = sorted(listed.values(), key=lambda group: group.group_id)
    if args.json:
        print_json([{"group_id": g.group_id, "group_type": g.group_type, "group_state": g.group_state, "protocol_type": g.protocol_type} for g in groups])
    elif groups:
        print_table(("GROUP", "TYPE", "STATE", "PROTOCOL-TYPE"), ((g.group_id, g.group_type, g.group_state, g.protocol_type) for g in groups))
    else:
        print("no groups")
    if missing:
        return fail("groups", "the list lacks the groups of " + "; ".join(missing))
    return 0


def format_partitions(topic_partitions: Iterable[Any]) -> str:
    """``foo:0-2,5 bar:1`` — partition ranges by topic name (the topic id when unnamed)."""
    return format_named({str(t.topic_name or t.topic_id): t.partitions for t in topic_partitions})


def format_named(partitions: Mapping[str, Iterable[int]]) -> str:
    """``foo:0-2,5 bar:1`` from partitions by topic name."""
    return " ".join(f"{topic}:{_ranges(sorted(numbers))}" for topic, numbers in sorted(partitions.items()) if numbers) or "-"


def _ranges(indexes: list[int]) -> str:
    spans: list[list[int]] = []
    for index in indexes:
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _assignment_json(assignment: Any) -> dict[str, list[int]]:
    if assignment is None:
        return {}
    return {t.topic_name or str(t.topic_id): sorted(t.partitions) for t in assignment.topic_partitions if t.partitions}


def _describe(args: argparse.Namespace, client) -> int:
    import kafka.errors as Errors

    from pystreams.protocol import messages as m

    response = client.send(m.ConsumerGroupDescribeRequest(group_ids=[args.describe], include_authorized_operations=False))
    (group,) = response.groups
    if group.error_code == Errors.GroupIdNotFoundError.errno:
        # Not a consumer group: perhaps a classic one (Kafka's admin client falls back the same way).
        (classic,) = client.send(m.DescribeGroupsRequest(groups=[args.describe], include_authorized_operations=False)).groups
        if not classic.error_code and classic.group_state not in ("Dead", ""):
            return _describe_classic(args, classic)
    if group.error_code:
        return fail("groups", f"{args.describe}: {error_text(group.error_code, group.error_message)}")
    members = sorted(group.members or [], key=lambda member: member.member_id)
    if args.json:
        print_json(
            {
                "group_id": group.group_id,
                "group_type": "consumer",
                "group_state": group.group_state,
                "group_epoch": group.group_epoch,
                "assignment_epoch": group.assignment_epoch,
                "assignor": group.assignor_name,
                "members": [
                    {
                        "member_id": member.member_id,
                        "instance_id": member.instance_id,
                        "rack_id": member.rack_id,
                        "member_epoch": member.member_epoch,
                        "member_type": _member_type(member),
                        "client_id": member.client_id,
                        "client_host": member.client_host,
                        "subscribed_topic_names": list(member.subscribed_topic_names or []),
                        "subscribed_topic_regex": member.subscribed_topic_regex,
                        "assignment": _assignment_json(member.assignment),
                        "target_assignment": _assignment_json(member.target_assignment),
                    }
                    for member in members
                ],
            }
        )
        return 0
    print_table(
        ("GROUP", "TYPE", "STATE", "GROUP-EPOCH", "ASSIGNMENT-EPOCH", "ASSIGNOR", "MEMBERS"),
        [(group.group_id, "consumer", group.group_state, group.group_epoch, group.assignment_epoch, group.assignor_name, len(members))],
    )
    if not members:
        return 0
    print()

    def subscription(member: Any) -> str:
        names = ",".join(member.subscribed_topic_names or [])
        regex = f"/{member.subscribed_topic_regex}/" if member.subscribed_topic_regex else ""
        return " ".join(part for part in (names, regex) if part) or "-"

    print_table(
        ("MEMBER-ID", "INSTANCE-ID", "CLIENT-ID", "HOST", "PROTOCOL", "EPOCH", "SUBSCRIPTION", "ASSIGNMENT", "TARGET-ASSIGNMENT"),
        (
            (
                member.member_id,
                member.instance_id or "-",
                member.client_id,
                member.client_host,
                _member_type(member),
                member.member_epoch,
                subscription(member),
                format_partitions(member.assignment.topic_partitions if member.assignment else []),
                format_partitions(member.target_assignment.topic_partitions if member.target_assignment else []),
            )
            for member in members
        ),
    )
    return 0


def _member_type(member: Any) -> str:
    """classic / consumer from ConsumerGroupDescribe v1; "unknown" from a v0 coordinator."""
    return MEMBER_TYPES.get(getattr(member, "member_type", -1), "unknown")


def _describe_classic(args: argparse.Namespace, group: Any) -> int:
    """A classic group, from DescribeGroups: its members' embedded consumer protocol decoded
    (the subscription comes only while the group is Stable, as Kafka sends it)."""
    members = sorted(group.members or [], key=lambda member: member.member_id)
    consumer = group.protocol_type == "consumer"
    decoded = {member.member_id: _embedded(member) if consumer else (None, None) for member in members}
    if args.json:
        print_json(
            {
                "group_id": group.group_id,
                "group_type": "classic",
                "group_state": group.group_state,
                "protocol_type": group.protocol_type,
                "protocol": group.protocol_data,
                "members": [
                    {
                        "member_id": member.member_id,
                        "instance_id": member.group_instance_id,
                        "member_type": "classic",
                        "client_id": member.client_id,
                        "client_host": member.client_host,
                        "subscribed_topic_names": decoded[member.member_id][0],
                        "assignment": decoded[member.member_id][1],
                    }
                    for member in members
                ],
            }
        )
        return 0
    print_table(
        ("GROUP", "TYPE", "STATE", "PROTOCOL-TYPE", "PROTOCOL", "MEMBERS"),
        [(group.group_id, "classic", group.group_state, group.protocol_type or "-", group.protocol_data or "-", len(members))],
    )
    if not members:
        return 0
    print()
    print_table(
        ("MEMBER-ID", "INSTANCE-ID", "CLIENT-ID", "HOST", "PROTOCOL", "SUBSCRIPTION", "ASSIGNMENT"),
        (
            (
                member.member_id,
                member.group_instance_id or "-",
                member.client_id,
                member.client_host,
                "classic",
                ",".join(decoded[member.member_id][0] or []) or "-",
                format_named(decoded[member.member_id][1] or {}),
            )
            for member in members
        ),
    )
    return 0


def _embedded(member: Any) -> tuple[list[str] | None, dict[str, list[int]] | None]:
    """(subscribed topics, assignment by topic) of a consumer-protocol member; None where the
    bytes are absent or unreadable."""
    from pystreams.protocol.consumer_protocol import ConsumerProtocolError, decode_assignment, decode_subscription

    topics = assignment = None
    try:
        if member.member_metadata:
            topics = sorted(decode_subscription(bytes(member.member_metadata)).topics)
    except ConsumerProtocolError:
        pass
    try:
        decoded = decode_assignment(bytes(member.member_assignment or b""))
        assignment = {topic: sorted(numbers) for topic, numbers in decoded.partitions.items()}
    except ConsumerProtocolError:
        pass
    return topics, assignment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pystreams groups", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
