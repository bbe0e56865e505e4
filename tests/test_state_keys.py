"""Window and session key layouts: order-preserving, prefix-free, reversible."""

from hypothesis import given
from hypothesis import strategies as st
from pystreams.state import keys

timestamps = st.integers(min_value=keys.MIN_TIMESTAMP, max_value=keys.MAX_TIMESTAMP)
# Zero and 0xFF bytes are where an escaping scheme breaks, so draw them often.
user_keys = st.lists(st.sampled_from([0, 1, 2, 0x7F, 0xFE, 0xFF]) | st.integers(0, 255), max_size=6).map(bytes)


@given(timestamps, timestamps)
def test_timestamp_bytes_sort_like_numbers(a, b):
    assert (keys.encode_timestamp(a) < keys.encode_timestamp(b)) == (a < b)
    assert keys.decode_timestamp(keys.encode_timestamp(a)) == a


@given(user_keys, timestamps, user_keys, timestamps)
def test_window_keys_sort_by_key_then_time(key_a, time_a, key_b, time_b):
    composite_a = keys.window_key(key_a, time_a)
    composite_b = keys.window_key(key_b, time_b)
    assert (composite_a < composite_b) == ((key_a, time_a) < (key_b, time_b))
    assert keys.split_window_key(composite_a) == (key_a, time_a)
    assert keys.window_start_of(composite_a) == time_a


@given(user_keys, timestamps, user_keys, timestamps)
def test_all_windows_of_a_key_lie_inside_its_prefix_bounds(key, time, other_key, other_time):
    escaped = keys.escape_key(key)
    other = keys.window_key(other_key, other_time)
    inside = escaped <= other < keys.key_prefix_end(escaped)
    assert inside == (other_key == key)
    assert escaped <= keys.window_key(key, time) < keys.key_prefix_end(escaped)


@given(user_keys, timestamps, timestamps, user_keys, timestamps, timestamps)
def test_session_keys_sort_by_key_then_end_then_start(key_a, s_a, e_a, key_b, s_b, e_b):
    composite_a = keys.session_key(key_a, s_a, e_a)
    composite_b = keys.session_key(key_b, s_b, e_b)
    assert (composite_a < composite_b) == ((key_a, e_a, s_a) < (key_b, e_b, s_b))
    assert keys.split_session_key(composite_a) == (key_a, s_a, e_a)
    assert keys.session_start_of(composite_a) == s_a
    assert keys.session_end_of(composite_a) == e_a


def test_escaping_examples():
    assert keys.escape_key(b"ab") == b"ab\x00\x01"
    assert keys.escape_key(b"a\x00b") == b"a\x00\xffb\x00\x01"
    assert keys.unescape_key(keys.escape_key(b"\x00\x00\x01")) == b"\x00\x00\x01"
    # "a" must sort before "a\x00" although the raw bytes of the latter continue the former.
    assert keys.window_key(b"a", keys.MAX_TIMESTAMP) < keys.window_key(b"a\x00", keys.MIN_TIMESTAMP)
