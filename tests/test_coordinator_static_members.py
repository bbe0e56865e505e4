"""Static membership (KIP-345 within KIP-848): -2 temporary leave, rejoin, expiry, fencing."""

import kafka.errors as Errors
from coordinator_support import FAST, Harness, response_parts


def _two_static_members(h: Harness) -> int:
    h.topics(foo=2)
    h.scripted.next = {"A": "foo-0, foo-1"}
    h.join("A", instance_id="pod-a")
    h.scripted.next = {"A": "foo-0", "B": "foo-1"}
    h.join("B", instance_id="pod-b")
    h.heartbeat("A", 1)
    h.heartbeat("A", 1, "foo-0")
    h.heartbeat("B", 2)
    assert h.members() == {"A": (2, "foo-0", ""), "B": (2, "foo-1", "")}
    return h.group.group_epoch


def test_temporary_leave_and_rejoin_gets_the_assignment_back_without_a_rebalance():
    h = Harness()
    epoch = _two_static_members(h)
    response = h.heartbeat("B", -2, instance_id="pod-b")
    assert response.member_epoch == -2
    assert h.group.group_epoch == epoch  # no rebalance for a bounce
    assert h.group.members["B"].assigned  # keeps its partitions while away

    # The restarted process joins with a new member id and the same instance id.
    response = h.join("B2", instance_id="pod-b")
    assert response.error_code == 0
    assert (response.member_id, response.member_epoch, response_parts(response)) == ("B2", epoch, "foo-1")
    assert set(h.group.members) == {"A", "B2"}
    assert h.group.group_epoch == epoch
    assert h.group.static_members == {"pod-a": "A", "pod-b": "B2"}
    h.assert_replay_equals_live()


def test_instance_id_in_use_is_unreleased():
    h = Harness()
    _two_static_members(h)
    response = h.join("B2", instance_id="pod-b")
    assert response.error_code == Errors.UnreleasedInstanceIdError.errno
    assert "pod-b" in response.error_message and "B" in response.error_message
    assert "B2" not in h.group.members


def test_a_static_member_that_does_not_come_back_expires():
    h = Harness()
    epoch = _two_static_members(h)
    h.heartbeat("B", -2, instance_id="pod-b")
    h.scripted.next = {"A": "foo-0, foo-1"}
    for _ in range(FAST.session_timeout_ms // 100):
        h.advance(100)
        h.heartbeat("A", h.group.members["A"].member_epoch)
    assert "B" not in h.group.members
    assert h.group.group_epoch == epoch + 1
    assert h.members() == {"A": (epoch + 1, "foo-0, foo-1", "")}


def test_temporary_leave_must_name_the_members_instance_id():
    h = Harness()
    _two_static_members(h)
    response = h.heartbeat("B", -2, instance_id="pod-a")
    assert response.error_code == Errors.UnknownMemberIdError.errno
    assert h.group.members["B"].member_epoch == 2


def test_static_member_leaving_for_good_rebalances():
    h = Harness()
    epoch = _two_static_members(h)
    h.scripted.next = {"A": "foo-0, foo-1"}
    assert h.heartbeat("B", -1).member_epoch == -1
    assert "B" not in h.group.members and "pod-b" not in h.group.static_members
    assert h.group.group_epoch == epoch + 1
