"""KIP-848 "Case Studies", replayed step by step through the coordinator state machine.

Each step asserts the group epoch, the target assignment (with its epoch) and every member's
epoch, partitions and pending partitions as the KIP prints them (its typos aside), and that a
shard replaying the records has the same state.
"""

from coordinator_support import GROUP, Harness, response_parts

from pystreams.coordinator.consumer_group import GroupState


def test_basic():
    h = Harness()
    h.topics(foo=3)
    assert GROUP not in h.shard.groups  # Group (epoch=0): empty

    h.scripted.next = {"A": "foo-0, foo-1, foo-2"}
    response = h.join("A")
    # A joins: epoch 1; the target (epoch 1) gives it everything; nothing to revoke, so it moves
    # to epoch 1 with all the partitions in the same exchange.
    assert (h.group.group_epoch, h.group.assignment_epoch) == (1, 1)
    assert h.target() == {"A": "foo-0, foo-1, foo-2"}
    assert h.members() == {"A": (1, "foo-0, foo-1, foo-2", "")}
    assert (response.member_epoch, response_parts(response)) == (1, "foo-0, foo-1, foo-2")

    h.scripted.next = {"A": "foo-0, foo-1", "B": "foo-2"}
    response = h.join("B")
    assert (h.group.group_epoch, h.group.assignment_epoch) == (2, 2)
    assert h.target() == {"A": "foo-0, foo-1", "B": "foo-2"}
    # B can transition to epoch 2 but cannot get foo-2 until A revokes it.
    assert h.members() == {"A": (1, "foo-0, foo-1, foo-2", ""), "B": (2, "", "foo-2")}
    assert response_parts(response, "pending_topic_partitions") == "foo-2"
    assert h.group.state is GroupState.RECONCILING

    response = h.heartbeat("A", 1)  # A is told to revoke foo-2: it may keep foo-0, foo-1
    assert (response.member_epoch, response_parts(response)) == (1, "foo-0, foo-1")
    response = h.heartbeat("A", 1, "foo-0, foo-1")  # A acknowledges the revocation
    assert response.member_epoch == 2
    assert h.members() == {"A": (2, "foo-0, foo-1", ""), "B": (2, "", "foo-2")}

    response = h.heartbeat("B", 2)  # B now gets foo-2
    assert (response.member_epoch, response_parts(response)) == (2, "foo-2")
    assert h.members() == {"A": (2, "foo-0, foo-1", ""), "B": (2, "foo-2", "")}
    assert h.group.state is GroupState.STABLE

    h.scripted.next = {"A": "foo-0", "B": "foo-2", "C": "foo-1"}
    h.join("C")
    assert (h.group.group_epoch, h.group.assignment_epoch) == (3, 3)
    assert h.target() == {"A": "foo-0", "B": "foo-2", "C": "foo-1"}
    h.heartbeat("B", 2)  # nothing to revoke: straight to epoch 3
    assert h.members()["B"] == (3, "foo-2", "")
    assert h.members()["C"] == (3, "", "foo-1")  # at epoch 3, foo-1 not released yet
    assert h.members()["A"] == (2, "foo-0, foo-1", "")
    assert response_parts(h.heartbeat("A", 2)) == "foo-0"
    h.heartbeat("A", 2, "foo-0")
    assert h.members() == {"A": (3, "foo-0", ""), "B": (3, "foo-2", ""), "C": (3, "", "foo-1")}
    assert response_parts(h.heartbeat("C", 3)) == "foo-1"
    assert h.members() == {"A": (3, "foo-0", ""), "B": (3, "foo-2", ""), "C": (3, "foo-1", "")}
    assert h.group.state is GroupState.STABLE
    h.assert_replay_equals_live()


def test_incremental_revocation_and_assignment():
    h = Harness()
    h.topics(foo=6)
    h.scripted.next = {"A": "foo-0, foo-1, foo-2, foo-3, foo-4, foo-5"}
    h.join("A")
    h.scripted.next = {"A": "foo-0, foo-1, foo-2", "B": "foo-3, foo-4, foo-5"}
    h.join("B")
    h.heartbeat("A", 1)  # told to revoke foo-3..5
    h.heartbeat("A", 1, "foo-0, foo-1, foo-2")  # acknowledges
    h.heartbeat("B", 2)
    assert h.members() == {"A": (2, "foo-0, foo-1, foo-2", ""), "B": (2, "foo-3, foo-4, foo-5", "")}
    epoch = h.group.group_epoch

    h.scripted.next = {"A": "foo-0, foo-1", "B": "foo-3, foo-4", "C": "foo-2, foo-5"}
    h.join("C")  # C is added, the epoch bumps, the target is computed; C moves to the epoch
    assert h.group.group_epoch == h.group.assignment_epoch == epoch + 1
    assert h.target() == {"A": "foo-0, foo-1", "B": "foo-3, foo-4", "C": "foo-2, foo-5"}
    assert h.members() == {
        "A": (epoch, "foo-0, foo-1, foo-2", ""),
        "B": (epoch, "foo-3, foo-4, foo-5", ""),
        "C": (epoch + 1, "", "foo-2, foo-5"),
    }
    assert response_parts(h.heartbeat("A", epoch)) == "foo-0, foo-1"  # revoke foo-2
    assert response_parts(h.heartbeat("B", epoch)) == "foo-3, foo-4"  # revoke foo-5
    assert h.heartbeat("C", epoch + 1).assignment is not None  # no change for it: still pending
    assert h.members()["C"] == (epoch + 1, "", "foo-2, foo-5")

    h.heartbeat("A", epoch, "foo-0, foo-1")  # A acknowledges: epoch 22, foo-2 released
    assert h.members() == {
        "A": (epoch + 1, "foo-0, foo-1", ""),
        "B": (epoch, "foo-3, foo-4, foo-5", ""),
        "C": (epoch + 1, "", "foo-2, foo-5"),
    }
    response = h.heartbeat("C", epoch + 1)  # C gets foo-2, foo-5 stays pending
    assert (response_parts(response), response_parts(response, "pending_topic_partitions")) == ("foo-2", "foo-5")
    h.heartbeat("B", epoch, "foo-3, foo-4")
    assert response_parts(h.heartbeat("C", epoch + 1)) == "foo-2, foo-5"
    assert h.members() == {
        "A": (epoch + 1, "foo-0, foo-1", ""),
        "B": (epoch + 1, "foo-3, foo-4", ""),
        "C": (epoch + 1, "foo-2, foo-5", ""),
    }
    assert h.group.state is GroupState.STABLE
    h.assert_replay_equals_live()


def _three_members_six_partitions(h: Harness) -> int:
    h.topics(foo=6)
    h.scripted.next = {"A": "foo-0, foo-1", "B": "foo-3, foo-4", "C": "foo-2, foo-5"}
    h.join("A")
    h.scripted.next = {"A": "foo-0, foo-1", "B": "foo-3, foo-4", "C": "foo-2, foo-5"}
    h.join("B")
    h.scripted.next = {"A": "foo-0, foo-1", "B": "foo-3, foo-4", "C": "foo-2, foo-5"}
    h.join("C")
    for mid, spec in (("A", "foo-0, foo-1"), ("B", "foo-3, foo-4"), ("C", "foo-2, foo-5")):
        member = h.group.members[mid]
        h.heartbeat(mid, member.member_epoch, spec)
    for mid in "ABC":
        h.heartbeat(mid, h.group.members[mid].member_epoch)
    epoch = h.group.group_epoch
    assert h.members() == {"A": (epoch, "foo-0, foo-1", ""), "B": (epoch, "foo-3, foo-4", ""), "C": (epoch, "foo-2, foo-5", "")}
    return epoch


def test_member_failure():
    h = Harness()
    epoch = _three_members_six_partitions(h)
    # B and C keep heartbeating; A stops. After the session timeout A is removed.
    for _ in range(12):
        h.advance(100)
        h.heartbeat("B", epoch)
        h.scripted.next = {"B": "foo-3, foo-4, foo-0", "C": "foo-2, foo-5, foo-1"}
        h.heartbeat("C", epoch)
        if "A" not in h.group.members:
            break
    assert "A" not in h.group.members
    assert h.group.group_epoch == h.group.assignment_epoch == epoch + 1
    assert h.target() == {"B": "foo-0, foo-3, foo-4", "C": "foo-1, foo-2, foo-5"}
    h.heartbeat("B", h.group.members["B"].member_epoch)
    h.heartbeat("C", h.group.members["C"].member_epoch)
    assert h.members() == {"B": (epoch + 1, "foo-0, foo-3, foo-4", ""), "C": (epoch + 1, "foo-1, foo-2, foo-5", "")}
    h.assert_replay_equals_live()


def test_partition_added():
    h = Harness()
    h.topics(foo=1)
    h.scripted.next = {"A": "foo-0", "B": ""}
    h.join("A")
    h.scripted.next = {"A": "foo-0", "B": ""}
    h.join("B")
    h.heartbeat("A", h.group.members["A"].member_epoch, "foo-0")
    epoch = h.group.group_epoch
    assert h.members() == {"A": (epoch, "foo-0", ""), "B": (epoch, "", "")}

    h.scripted.next = {"A": "foo-0", "B": "foo-1"}
    h.topics(foo=2)  # the coordinator detects foo-1, bumps the epoch and computes the target
    assert h.group.group_epoch == h.group.assignment_epoch == epoch + 1
    assert h.target() == {"A": "foo-0", "B": "foo-1"}
    assert h.members() == {"A": (epoch, "foo-0", ""), "B": (epoch, "", "")}
    h.heartbeat("A", epoch)
    h.heartbeat("B", epoch)
    assert h.members() == {"A": (epoch + 1, "foo-0", ""), "B": (epoch + 1, "foo-1", "")}
    assert h.group.state is GroupState.STABLE
    h.assert_replay_equals_live()
