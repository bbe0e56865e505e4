"""ACLs for the coordinator's resources, as Kafka's authorizer decides them.

An ACL binding says that a principal (``User:alice``, or ``User:*``) from a host (an address or
``*``) is allowed or denied an operation on a resource (a Group by literal or prefixed name, or
``*``; the Cluster). As in Kafka's StandardAuthorizer: a matching DENY wins over any ALLOW; with
no matching ALLOW the answer is no (``allow.everyone.if.no.acl.found=false``); ``super.users``
may do everything; Read, Write, Delete and Alter imply Describe, and AlterConfigs implies
DescribeConfigs.

What each API needs is KIP-848's table (``PERMISSIONS``): Read on the group for the heartbeats,
Prepare/Install, OffsetCommit and the classic APIs; Describe on the group for OffsetFetch,
DescribeGroups and ConsumerGroupDescribe; Describe on the cluster for ListGroups (without it,
the groups the principal may describe are listed); DescribeConfigs / AlterConfigs on the group.

ACLs live in a JSON file, re-read when it changes (checked at most once a second); a file that
no longer parses keeps the previous ACLs and logs why::

    {"acls": [{"principal": "User:alice", "operation": "Read", "resource_type": "Group",
               "resource_name": "wordcount", "pattern_type": "literal",
               "permission": "allow", "host": "*"}]}
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pystreams.protocol import messages as m

log = logging.getLogger(__name__)

OPERATIONS = ("All", "Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "DescribeConfigs", "AlterConfigs")
RESOURCE_TYPES = ("Group", "Cluster")
CLUSTER_NAME = "kafka-cluster"
_IMPLIES = {"Describe": {"Read", "Write", "Delete", "Alter", "Describe"}, "DescribeConfigs": {"AlterConfigs", "DescribeConfigs"}}

#: api key -> (operation, resource type): what a request needs (KIP-848 "Security / ACLs").
PERMISSIONS: dict[int, tuple[str, str]] = {
    m.ConsumerGroupHeartbeatRequest.API_KEY: ("Read", "Group"),
    m.ConsumerGroupPrepareAssignmentRequest.API_KEY: ("Read", "Group"),
    m.ConsumerGroupInstallAssignmentRequest.API_KEY: ("Read", "Group"),
    m.OffsetCommitRequest.API_KEY: ("Read", "Group"),
    m.JoinGroupRequest.API_KEY: ("Read", "Group"),
    m.SyncGroupRequest.API_KEY: ("Read", "Group"),
    m.HeartbeatRequest.API_KEY: ("Read", "Group"),
    m.LeaveGroupRequest.API_KEY: ("Read", "Group"),
    m.OffsetFetchRequest.API_KEY: ("Describe", "Group"),
    m.DescribeGroupsRequest.API_KEY: ("Describe", "Group"),
    m.ConsumerGroupDescribeRequest.API_KEY: ("Describe", "Group"),
    m.ListGroupsRequest.API_KEY: ("Describe", "Cluster"),
    m.DescribeConfigsRequest.API_KEY: ("DescribeConfigs", "Group"),
    m.IncrementalAlterConfigsRequest.API_KEY: ("AlterConfigs", "Group"),
}


class AclError(ValueError):
    """An ACL document that cannot be used, with the reason."""


def _canonical(value: str, allowed: Iterable[str], what: str) -> str:
    for candidate in allowed:
        if candidate.lower() == str(value).lower():
            return candidate
    raise AclError(f"unknown {what} {value!r} (expected one of {', '.join(allowed)})")


@dataclass(frozen=True)
class AclBinding:
    principal: str
    operation: str
    resource_type: str
    resource_name: str
    pattern_type: str = "literal"
    permission: str = "allow"
    host: str = "*"

    @classmethod
    def from_json(cls, data: object, index: int) -> AclBinding:
        if not isinstance(data, dict):
            raise AclError(f"acls[{index}] must be an object")
        try:
            binding = cls(
                principal=str(data["principal"]),
                operation=_canonical(data["operation"], OPERATIONS, "operation"),
                resource_type=_canonical(data["resource_type"], RESOURCE_TYPES, "resource type"),
                resource_name=str(data.get("resource_name", CLUSTER_NAME if str(data["resource_type"]).lower() == "cluster" else "")),
                pattern_type=_canonical(data.get("pattern_type", "literal"), ("literal", "prefixed"), "pattern type"),
                permission=_canonical(data.get("permission", "allow"), ("allow", "deny"), "permission"),
                host=str(data.get("host", "*")),
            )
        except KeyError as missing:
            raise AclError(f"acls[{index}] needs {missing.args[0]}") from None
        except AclError as error:
            raise AclError(f"acls[{index}]: {error}") from None
        if not binding.principal.startswith("User:"):
            raise AclError(f"acls[{index}]: a principal looks like User:NAME (or User:*), got {binding.principal!r}")
        if not binding.resource_name:
            raise AclError(f"acls[{index}]: resource_name must be non-empty (or * for every {binding.resource_type.lower()})")
        return binding

    def applies(self, principal: str, host: str, operation: str, resource_type: str, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.principal not in (principal, "User:*") or self.host not in (host, "*"):
            return False
        if self.operation != "All" and self.operation != operation and self.operation not in _IMPLIES.get(operation, ()):
            return False
        if self.resource_name == "*":
            return True
        return name.startswith(self.resource_name) if self.pattern_type == "prefixed" else name == self.resource_name

    def implies_only(self, operation: str) -> bool:
        """A DENY of Read does not deny Describe: only ALLOWs imply other operations (Kafka)."""
        return self.operation in ("All", operation)


@dataclass(frozen=True)
class Acls:
    bindings: tuple[AclBinding, ...] = ()

    @classmethod
    def loads(cls, text: str, source: str = "ACLs") -> Acls:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            raise AclError(f"{source} is not JSON: {error}") from None
        entries = document.get("acls") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise AclError(f'{source} must be {{"acls": [...]}}')
        return cls(tuple(AclBinding.from_json(entry, index) for index, entry in enumerate(entries)))

    def allows(self, principal: str, host: str, operation: str, resource_type: str, name: str) -> bool:
        allowed = False
        for binding in self.bindings:
            if not binding.applies(principal, host, operation, resource_type, name):
                continue
            if binding.permission == "deny":
                if binding.implies_only(operation):
                    return False
            else:
                allowed = True
        return allowed


class Authorizer:
    """ACLs from a file (re-read when it changes) plus ``super.users``."""

    def __init__(
        self, path: str | os.PathLike[str], super_users: Iterable[str] = (), *, clock: Callable[[], float] = time.monotonic, check_interval_s: float = 1.0
    ) -> None:
        self.path = os.fspath(path)
        self.super_users = frozenset(super_users)
        self._clock = clock
        self._check_interval_s = check_interval_s
        self._checked_at = -float("inf")
        self._mtime: float | None = None
        self.acls = self._read()  # a file that does not parse at start is an error
        self.denials = 0

    def _read(self) -> Acls:
        try:
            with open(self.path, encoding="utf-8") as file:
                self._mtime = os.fstat(file.fileno()).st_mtime
                return Acls.loads(file.read(), self.path)
        except OSError as error:
            raise AclError(f"cannot read the ACL file {self.path}: {error.strerror}") from None

    def _maybe_reload(self) -> None:
        now = self._clock()
        if now - self._checked_at < self._check_interval_s:
            return
        self._checked_at = now
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError as error:
            log.error("ACL file %s cannot be read (%s); keeping the ACLs loaded before", self.path, error.strerror)
            return
        if mtime == self._mtime:
            return
        try:
            self.acls = self._read()
            log.info("ACL file %s reloaded: %d bindings", self.path, len(self.acls.bindings))
        except AclError as error:
            self._mtime = mtime  # do not retry a broken file every second; the next edit will
            log.error("ACL file %s changed but cannot be used (%s); keeping the ACLs loaded before", self.path, error)

    def allows(self, principal: str, host: str, operation: str, resource_type: str, name: str = CLUSTER_NAME) -> bool:
        if principal in self.super_users:
            return True
        self._maybe_reload()
        if self.acls.allows(principal, host, operation, resource_type, name):
            return True
        self.denials += 1
        return False
