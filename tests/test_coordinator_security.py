"""TLS, SASL and ACLs on the coordinator's listener.

An in-process coordinator on the memory log behind the real ``KafkaProtocolServer``, with a
throwaway CA (trustme) for the certificates; clients are kafka-python's ``KafkaAdminClient``
and pystreams' own tools client. The process-level run of a worker fleet over SASL_SSL is in
``test_worker_security.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kafka.errors as Errors
import pytest
import trustme
from kafka.admin import KafkaAdminClient
from pystreams.assignors.api import TopicMetadata

from pystreams.coordinator.authorizer import AclError, Acls, Authorizer
from pystreams.coordinator.config import CoordinatorConfig
from pystreams.coordinator.log import MemoryLog
from pystreams.coordinator.runtime import Coordinator, StaticTopics
from pystreams.protocol import messages as m
from pystreams.protocol.client import KafkaProtocolClient, ProtocolClientError
from pystreams.protocol.sasl import CredentialError, CredentialStore, SaslServer
from pystreams.protocol.security import ClientSecurity, Listener, ListenerSecurity
from pystreams.protocol.server import KafkaProtocolServer

GUARD_S = 20.0
FOO = TopicMetadata(uuid.UUID(int=0xF00), "foo", 4)
CONFIG = CoordinatorConfig(
    session_timeout_ms=30_000,
    min_session_timeout_ms=1_000,
    max_session_timeout_ms=60_000,
    heartbeat_interval_ms=500,
    min_heartbeat_interval_ms=100,
    max_heartbeat_interval_ms=2_000,
)
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "admin": "admin-secret"}
HB = m.ConsumerGroupHeartbeatRequest


# --- ACL semantics -------------------------------------------------------------------------------


def acls(*bindings: dict) -> Acls:
    return Acls.loads(json.dumps({"acls": list(bindings)}))


def test_acls_allow_what_is_granted_and_deny_wins():
    rules = acls(
        {"principal": "User:alice", "operation": "Read", "resource_type": "Group", "resource_name": "orders-"},
        {"principal": "User:alice", "operation": "read", "resource_type": "group", "resource_name": "orders-", "pattern_type": "prefixed"},
        {"principal": "User:alice", "operation": "Read", "resource_type": "Group", "resource_name": "orders-secret", "permission": "deny"},
        {"principal": "User:*", "operation": "Describe", "resource_type": "Group", "resource_name": "*"},
        {"principal": "User:bob", "operation": "AlterConfigs", "resource_type": "Group", "resource_name": "tuned", "host": "10.0.0.9"},
    )
    assert rules.allows("User:alice", "1.2.3.4", "Read", "Group", "orders-eu")  # prefixed
    assert not rules.allows("User:alice", "1.2.3.4", "Read", "Group", "orders-secret")  # DENY wins
    assert rules.allows("User:alice", "1.2.3.4", "Describe", "Group", "orders-secret")  # a DENY of Read is not a DENY of Describe
    assert not rules.allows("User:alice", "1.2.3.4", "Read", "Group", "billing")  # nothing granted: no
    assert rules.allows("User:carol", "1.2.3.4", "Describe", "Group", "anything")  # User:* and resource *
    assert rules.allows("User:bob", "10.0.0.9", "DescribeConfigs", "Group", "tuned")  # AlterConfigs implies DescribeConfigs
    assert not rules.allows("User:bob", "10.0.0.8", "AlterConfigs", "Group", "tuned")  # another host
    assert not rules.allows("User:bob", "10.0.0.9", "Describe", "Cluster", "kafka-cluster")


def test_acl_documents_that_cannot_be_used_say_why():
    for document, reason in [
        ('{"acls": [{"operation": "Read", "resource_type": "Group", "resource_name": "g"}]}', "needs principal"),
        ('{"acls": [{"principal": "alice", "operation": "Read", "resource_type": "Group", "resource_name": "g"}]}', "User:NAME"),
        ('{"acls": [{"principal": "User:a", "operation": "Fly", "resource_type": "Group", "resource_name": "g"}]}', "unknown operation 'Fly'"),
        ('{"acls": [{"principal": "User:a", "operation": "Read", "resource_type": "Topic", "resource_name": "g"}]}', "unknown resource type"),
        ("[1, 2]", '{"acls": [...]}'),
        ("{not json", "not JSON"),
    ]:
        with pytest.raises(AclError, match=re.escape(reason)):
            Acls.loads(document)


def test_the_acl_file_is_reloaded_when_it_changes_and_a_broken_edit_keeps_the_last_good_acls(tmp_path: Path):
    path = tmp_path / "acls.json"
    grant = {"principal": "User:alice", "operation": "Read", "resource_type": "Group", "resource_name": "g"}
    path.write_text(json.dumps({"acls": []}))
    now = [0.0]
    authorizer = Authorizer(path, super_users=["User:admin"], clock=lambda: now[0])
    assert not authorizer.allows("User:alice", "h", "Read", "Group", "g")
    assert authorizer.allows("User:admin", "h", "AlterConfigs", "Group", "g")  # super.users
    path.write_text(json.dumps({"acls": [grant]}))
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert not authorizer.allows("User:alice", "h", "Read", "Group", "g")  # checked at most once a second
    now[0] = 2.0
    assert authorizer.allows("User:alice", "h", "Read", "Group", "g")
    path.write_text("{broken")
    os.utime(path, (time.time() + 10, time.time() + 10))
    now[0] = 4.0
    assert authorizer.allows("User:alice", "h", "Read", "Group", "g")  # the last good ACLs stand


# --- SASL -----------------------------------------------------------------------------------------


def test_sasl_plain_and_scram_accept_the_right_password_only():
    from kafka.net.sasl.scram import SaslMechanismScram

    store = CredentialStore().with_user("alice", "right")
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        for password, accepted in (("right", True), ("wrong", False)):
            server = SaslServer(["PLAIN", mechanism], store)
            assert server.handshake(mechanism) == 0
            client = SaslMechanismScram(sasl_plain_username="alice", sasl_plain_password=password, sasl_mechanism=mechanism, security_protocol="SASL_SSL")
            first = server.authenticate(client.auth_bytes())
            client.receive(first.auth_bytes)
            final = server.authenticate(client.auth_bytes())
            assert (final.error_code == 0) == accepted and (final.principal == "User:alice") == accepted
    for token, accepted in (
        (b"\x00alice\x00right", True),
        (b"alice\x00alice\x00right", True),
        (b"\x00alice\x00wrong", False),
        (b"bob\x00alice\x00right", False),
        (b"garbage", False),
        (b"\x00nobody\x00right", False),
    ):
        server = SaslServer(["PLAIN"], store)
        server.handshake("PLAIN")
        assert (server.authenticate(token).error_code == 0) == accepted, token


def test_sasl_refuses_an_unknown_mechanism_and_a_second_handshake():
    server = SaslServer(["SCRAM-SHA-512"], CredentialStore())
    assert server.handshake("PLAIN") == Errors.UnsupportedSaslMechanismError.errno
    assert server.handshake("SCRAM-SHA-512") == 0
    assert server.handshake("SCRAM-SHA-512") == Errors.IllegalSaslStateError.errno
    assert SaslServer(["PLAIN"], CredentialStore()).authenticate(b"x").error_code == Errors.IllegalSaslStateError.errno


def test_credentials_store_salted_keys_never_the_password():
    store = CredentialStore().with_user("alice", "p4ssw0rd", iterations=8192)
    text = store.dumps()
    assert "p4ssw0rd" not in text
    again = CredentialStore.loads(text)
    assert again.check_password("alice", "p4ssw0rd") and not again.check_password("alice", "other")
    assert again.scram("alice", "SCRAM-SHA-512").iterations == 8192
    with pytest.raises(CredentialError, match="at least 4096"):
        CredentialStore().with_user("bob", "x", iterations=10)
    with pytest.raises(CredentialError, match="unknown mechanism"):
        CredentialStore.loads('{"users": {"a": {"MD5": {}}}}')


def test_listeners_parse_like_kafkas_and_refuse_what_cannot_work():
    assert Listener.parse("SASL_SSL://0.0.0.0:9093") == Listener("SASL_SSL", "0.0.0.0", 9093)
    assert Listener.parse("127.0.0.1:9093") == Listener("PLAINTEXT", "127.0.0.1", 9093)
    assert Listener.parse("ssl://[::1]:1") == Listener("SSL", "::1", 1)
    for text in ("HTTP://h:1", "SASL_SSL://h", "h:99999"):
        with pytest.raises(ValueError):
            Listener.parse(text)
    with pytest.raises(ValueError, match="certificate"):
        ListenerSecurity("SSL")
    with pytest.raises(ValueError, match="credentials"):
        ListenerSecurity("SASL_PLAINTEXT")
    with pytest.raises(ValueError, match="ssl-cafile"):
        ListenerSecurity("SSL", ssl_certfile="x.pem", ssl_client_auth="required")
    with pytest.raises(ValueError, match="sasl_mechanism"):
        ClientSecurity("SASL_SSL", sasl_plain_username="a", sasl_plain_password="b")


# --- a secured coordinator ------------------------------------------------------------------------


@dataclass
class Pki:
    ca_file: str
    server_file: str
    client_cert: trustme.LeafCert
    directory: Path

    def client_files(self) -> tuple[str, str]:
        cert, key = self.directory / "client.crt", self.directory / "client.key"
        self.client_cert.cert_chain_pems[0].write_to_path(str(cert))
        self.client_cert.private_key_pem.write_to_path(str(key))
        return str(cert), str(key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(directory / "server.pem"))
    client = ca.issue_cert("worker-7@pystreams.test", common_name="worker-7", organization_name="pystreams", organization_unit_name="workers")
    return Pki(str(directory / "ca.pem"), str(directory / "server.pem"), client, directory)


@dataclass
class Secured:
    server: KafkaProtocolServer
    coordinator: Coordinator
    loop: asyncio.AbstractEventLoop
    ca_file: str

    @property
    def port(self) -> int:
        return self.server.port

    def security(self, user: str, mechanism: str = "SCRAM-SHA-256", password: str | None = None) -> ClientSecurity:
        return ClientSecurity(
            "SASL_SSL",
            ssl_cafile=self.ca_file,
            sasl_mechanism=mechanism,
            sasl_plain_username=user,
            sasl_plain_password=PASSWORDS.get(user, "") if password is None else password,
        )

    def client(self, user: str, **kwargs: object) -> KafkaProtocolClient:
        return KafkaProtocolClient("127.0.0.1", self.port, timeout_s=GUARD_S, security=self.security(user, **kwargs)).connect()  # type: ignore[arg-type]


def serve(listener: ListenerSecurity, authorizer: Authorizer | None) -> Iterator[tuple[KafkaProtocolServer, Coordinator, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        coordinator = Coordinator(MemoryLog(2), config=CONFIG, topic_source=StaticTopics({"foo": FOO}), authorizer=authorizer)
        await coordinator.start()
        await coordinator.wait_until_loaded()
        server = KafkaProtocolServer("127.0.0.1", 0, coordinator.handle, security=listener)
        await server.start()
        return server, coordinator

    server, coordinator = asyncio.run_coroutine_threadsafe(start(), loop).result(GUARD_S)
    try:
        yield server, coordinator, loop
    finally:

        async def stop():
            await coordinator.close()
            await server.close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(GUARD_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(GUARD_S)
        loop.close()


ACLS = {
    "acls": [
        {"principal": "User:alice", "operation": "Read", "resource_type": "Group", "resource_name": "alice-", "pattern_type": "prefixed"},
        {"principal": "User:alice", "operation": "Describe", "resource_type": "Group", "resource_name": "shared"},
        {"principal": "User:CN=worker-7,OU=workers,O=pystreams", "operation": "All", "resource_type": "Group", "resource_name": "*"},
    ]
}


@pytest.fixture(scope="module")
def secured(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    store = CredentialStore()
    for user, password in PASSWORDS.items():
        store = store.with_user(user, password)
    acl_file = tmp_path_factory.mktemp("acls") / "acls.json"
    acl_file.write_text(json.dumps(ACLS))
    listener = ListenerSecurity("SASL_SSL", ssl_certfile=pki.server_file, credentials=store)
    for server, coordinator, loop in serve(listener, Authorizer(acl_file, super_users=["User:admin"])):
        yield Secured(server, coordinator, loop, pki.ca_file)


def join(client: KafkaProtocolClient, group: str) -> m.ConsumerGroupHeartbeatResponse:
    return client.send(HB(group_id=group, member_id="", member_epoch=0, rebalance_timeout_ms=5_000, subscribed_topic_names=["foo"], topic_partitions=[]))


def commit(client: KafkaProtocolClient, group: str) -> list[int]:
    topic = m.OffsetCommitRequest.OffsetCommitRequestTopic
    response = client.send(
        m.OffsetCommitRequest(
            group_id=group,
            generation_id_or_member_epoch=-1,
            member_id="",
            topics=[topic(name="foo", partitions=[topic.OffsetCommitRequestPartition(partition_index=0, committed_offset=1)])],
        ),
        version=9,
    )
    return [p.error_code for t in response.topics for p in t.partitions]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_pythons_admin_client_lists_groups_over_sasl_ssl(secured: Secured, mechanism: str) -> None:
    with secured.client("admin") as client:
        assert join(client, "admin-listed").error_code == 0
    admin = KafkaAdminClient(
        bootstrap_servers=f"127.0.0.1:{secured.port}",
        security_protocol="SASL_SSL",
        ssl_cafile=secured.ca_file,
        sasl_mechanism=mechanism,
        sasl_plain_username="admin",
        sasl_plain_password=PASSWORDS["admin"],
        request_timeout_ms=5_000,
        client_id="security-test",
    )
    try:
        assert "admin-listed" in {group["group_id"] for group in admin.list_groups()}
    finally:
        admin.close()


def test_a_wrong_password_is_refused_and_counted(secured: Secured) -> None:
    before = secured.server.refusals["authentication_failed"]
    for mechanism in ("PLAIN", "SCRAM-SHA-512"):
        with pytest.raises(ProtocolClientError, match="SASL"):
            secured.client("alice", mechanism=mechanism, password="not-alices")
    with pytest.raises(ProtocolClientError, match="SASL"):
        secured.client("mallory", password="whatever")
    assert secured.server.refusals["authentication_failed"] == before + 3


def test_plaintext_and_unauthenticated_requests_are_refused(secured: Secured) -> None:
    with pytest.raises(ProtocolClientError):  # no TLS: the handshake never completes
        KafkaProtocolClient("127.0.0.1", secured.port, timeout_s=3).connect()
    # TLS, but a request before SASL: Kafka closes the connection.
    tls_only = KafkaProtocolClient("127.0.0.1", secured.port, timeout_s=5, security=ClientSecurity("SSL", ssl_cafile=secured.ca_file))
    with pytest.raises(ProtocolClientError, match="closed"):
        tls_only.connect()
        join(tls_only, "alice-sneaky")
    assert secured.server.refusals["unauthenticated_request"] >= 1


def test_acls_decide_who_may_heartbeat_commit_and_describe(secured: Secured) -> None:
    with secured.client("alice") as alice, secured.client("bob") as bob, secured.client("admin") as admin:
        assert join(alice, "alice-orders").error_code == 0
        assert commit(alice, "alice-orders") == [Errors.UnknownMemberIdError.errno]  # allowed, refused by the group
        assert join(admin, "shared").error_code == 0
        denied = join(bob, "alice-orders")
        assert denied.error_code == Errors.GroupAuthorizationFailedError.errno
        assert "User:bob may not Read group 'alice-orders'" in denied.error_message
        assert commit(bob, "alice-orders") == [Errors.GroupAuthorizationFailedError.errno]
        assert join(alice, "shared").error_code == Errors.GroupAuthorizationFailedError.errno  # Describe is not Read
        described = alice.send(m.ConsumerGroupDescribeRequest(group_ids=["shared", "secret", "alice-orders"], include_authorized_operations=False))
        assert [(g.group_id, g.error_code) for g in described.groups] == [
            ("shared", 0),
            ("secret", Errors.GroupAuthorizationFailedError.errno),
            ("alice-orders", 0),
        ]
        # No Describe on the cluster: ListGroups shows only the groups alice may describe.
        listed = {g.group_id for g in alice.send(m.ListGroupsRequest(states_filter=[], types_filter=[])).groups}
        assert listed == {"shared", "alice-orders"}
        everything = {g.group_id for g in admin.send(m.ListGroupsRequest(states_filter=[], types_filter=[])).groups}
        assert {"shared", "alice-orders"} <= everything
        config = m.IncrementalAlterConfigsRequest.AlterConfigsResource
        altered = bob.send(
            m.IncrementalAlterConfigsRequest(
                validate_only=False,
                resources=[
                    config(
                        resource_type=16,
                        resource_name="alice-orders",
                        configs=[config.AlterableConfig(name="group.consumer.session.timeout.ms", config_operation=0, value="40000")],
                    )
                ],
            )
        )
        assert altered.responses[0].error_code == Errors.GroupAuthorizationFailedError.errno
    assert secured.coordinator.authorizer is not None and secured.coordinator.authorizer.denials >= 5


def test_mutual_tls_makes_the_certificate_the_principal(pki: Pki, tmp_path: Path) -> None:
    acl_file = tmp_path / "acls.json"
    acl_file.write_text(json.dumps(ACLS))
    listener = ListenerSecurity("SSL", ssl_certfile=pki.server_file, ssl_cafile=pki.ca_file, ssl_client_auth="required")
    for server, _, _ in serve(listener, Authorizer(acl_file)):
        cert, key = pki.client_files()
        worker = KafkaProtocolClient(
            "127.0.0.1", server.port, timeout_s=GUARD_S, security=ClientSecurity("SSL", ssl_cafile=pki.ca_file, ssl_certfile=cert, ssl_keyfile=key)
        )
        with worker:
            assert join(worker, "any-group").error_code == 0  # User:CN=worker-7,OU=workers,O=pystreams may do All
        with pytest.raises(ProtocolClientError):  # no client certificate: the TLS handshake fails
            KafkaProtocolClient("127.0.0.1", server.port, timeout_s=5, security=ClientSecurity("SSL", ssl_cafile=pki.ca_file)).connect().send(
                m.ListGroupsRequest(states_filter=[], types_filter=[])
            )
