"""``pystreams configs``: read and change a group's dynamic configs on the coordinator.

* ``--group G --describe`` — DescribeConfigs for the GROUP resource: every group config, its
  value, and whether it is the coordinator's default or set for this group;
* ``--group G --alter key=value [key=value ...]`` — IncrementalAlterConfigs: ``key=value``
  SETs, ``key=`` (empty value) DELETEs the override, back to the default.

The coordinator validates values (bounds, heartbeat < session); its error is printed and the
exit status is 1. Tables by default, ``--json`` for scripts; ``--coordinator`` may come from
``PYSTREAMS_COORDINATOR``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pystreams.commands.groups import add_coordinator_option, connect, error_text, fail, print_json, print_table

HELP = "describe or alter a group's dynamic configs (session timeout, heartbeat interval, ...)"

GROUP_RESOURCE_TYPE = 16  # ConfigResource.Type.GROUP
OP_SET, OP_DELETE = 0, 1  # IncrementalAlterConfigs operations
#: DescribeConfigs ConfigSource values Kafka uses for group configs.
CONFIG_SOURCE_DEFAULT = 5
CONFIG_SOURCES = {CONFIG_SOURCE_DEFAULT: "DEFAULT", 8: "GROUP_CONFIG"}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group", required=True, metavar="GROUP", help="the group whose configs to read or change")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true", help="show the group's configs")
    action.add_argument("--alter", nargs="+", metavar="KEY=VALUE", help="set configs; KEY= (empty value) deletes the group's override")
    add_coordinator_option(parser)


def parse_alterations(items: list[str]) -> list[tuple[str, int, str | None]]:
    """``key=value`` -> (key, SET, value); ``key=`` -> (key, DELETE, None)."""
    alterations: list[tuple[str, int, str | None]] = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE (or KEY= to delete), got {item!r}")
        alterations.append((key, OP_SET, value) if value != "" else (key, OP_DELETE, None))
    return alterations


def run(args: argparse.Namespace) -> int:
    from pystreams.protocol.client import ProtocolClientError

    try:
        alterations = parse_alterations(args.alter) if args.alter else []
    except ValueError as error:
        return fail("configs", str(error), 2)
    try:
        with connect(args, group=args.group) as client:
            if args.describe:
                return _describe(args, client)
            return _alter(args, client, alterations)
    except ValueError as error:
        return fail("configs", str(error), 2)
    except ProtocolClientError as error:
        return fail("configs", str(error))


def _describe(args: argparse.Namespace, client) -> int:
    from pystreams.protocol import messages as m

    Resource = m.DescribeConfigsRequest.DescribeConfigsResource
    response = client.send(
        m.DescribeConfigsRequest(
            resources=[Resource(resource_type=GROUP_RESOURCE_TYPE, resource_name=args.group, configuration_keys=None)],
            include_synonyms=False,
            include_documentation=False,
        )
    )
    (result,) = response.results
    if result.error_code:
        return fail("configs", f"{args.group}: {error_text(result.error_code, result.error_message)}")
    entries = sorted(result.configs or [], key=lambda entry: entry.name)
    if args.json:
        print_json(
            {
                "group": args.group,
                "configs": [
                    {
                        "name": e.name,
                        "value": e.value,
                        "source": CONFIG_SOURCES.get(e.config_source, str(e.config_source)),
                        "is_default": _is_default(e),
                        "read_only": bool(e.read_only),
                    }
                    for e in entries
                ],
            }
        )
        return 0
    print(f"configs of group {args.group}:")
    print_table(("NAME", "VALUE", "SOURCE"), ((e.name, e.value, CONFIG_SOURCES.get(e.config_source, str(e.config_source))) for e in entries))
    return 0


def _is_default(entry: Any) -> bool:
    """IsDefault exists only in DescribeConfigs v0; from v1 the config source says it (DEFAULT_CONFIG)."""
    if entry.config_source is not None and entry.config_source >= 0:
        return entry.config_source == CONFIG_SOURCE_DEFAULT
    return bool(entry.is_default)


def _alter(args: argparse.Namespace, client, alterations: list[tuple[str, int, str | None]]) -> int:
    from pystreams.protocol import messages as m

    Resource = m.IncrementalAlterConfigsRequest.AlterConfigsResource
    response = client.send(
        m.IncrementalAlterConfigsRequest(
            resources=[
                Resource(
                    resource_type=GROUP_RESOURCE_TYPE,
                    resource_name=args.group,
                    configs=[Resource.AlterableConfig(name=key, config_operation=operation, value=value) for key, operation, value in alterations],
                )
            ],
            validate_only=False,
        )
    )
    (result,) = response.responses
    if result.error_code:
        if args.json:
            print_json({"group": args.group, "ok": False, "error": error_text(result.error_code, result.error_message)})
        return fail("configs", f"{args.group}: {error_text(result.error_code, result.error_message)}")
    set_values = {key: value for key, operation, value in alterations if operation == OP_SET}
    deleted = [key for key, operation, _ in alterations if operation == OP_DELETE]
    if args.json:
        print_json({"group": args.group, "ok": True, "set": set_values, "deleted": deleted})
        return 0
    for key, value in set_values.items():
        print(f"set {key}={value} for group {args.group}")
    for key in deleted:
        print(f"deleted {key} for group {args.group} (back to the coordinator's default)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pystreams configs", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
