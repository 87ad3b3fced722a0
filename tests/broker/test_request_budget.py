"""The broker-wide request budget (queued.max.requests, queued.max.request.bytes), the
FrameReader's admission hook that asks it before a frame costs memory, and their config keys."""

from __future__ import annotations

import struct

import pytest

from oncelog.broker.config import BrokerConfig, ConfigError
from oncelog.broker.request_budget import RequestBudget
from oncelog.protocol.messages import FrameReader

MiB = 1 << 20


# --- RequestBudget ------------------------------------------------------------------------------


def test_a_frame_is_admitted_while_anything_is_left_whatever_its_size():
    budget = RequestBudget(max_requests=500, max_bytes=100 * MiB)
    assert budget.admit("a", 99 * MiB)
    assert budget.admit("b", 100 * MiB)  # 1 MiB was left: admitted, as Kafka's pool does
    assert budget.bytes == 199 * MiB
    assert not budget.admit("c", 8)  # nothing left
    assert budget.is_waiting("c") and budget.refusals == 1
    budget.finished(199 * MiB)
    assert budget.offer() == "c"


def test_the_count_is_what_connections_report_as_waiting_for_the_broker():
    budget = RequestBudget(max_requests=2, max_bytes=-1)
    assert budget.admit("a", 10) and budget.admit("a", 10)
    budget.count(2)  # a's pass ends: both wait for the broker
    assert not budget.admit("b", 10)
    budget.count(-1)  # a handler took one up, or a's requests now wait for something else
    assert budget.requests == 1 and budget.bytes == 20
    assert budget.offer() == "b"
    assert budget.admit("b", 10)
    budget.finished(10)
    assert budget.bytes == 20


def test_no_limit_on_bytes_when_not_positive():
    for unlimited in (-1, 0):
        budget = RequestBudget(max_requests=10, max_bytes=unlimited)
        assert all(budget.admit("a", 1 << 40) for _ in range(10))
        budget.count(10)
        assert not budget.admit("a", 1)  # the count still holds


def test_waiters_are_offered_room_in_arrival_order_and_nobody_cuts_in_line():
    budget = RequestBudget(max_requests=1, max_bytes=-1)
    assert budget.admit("flood", 100)
    budget.count(1)
    assert not budget.admit("a", 1)
    assert not budget.admit("b", 1)
    assert not budget.admit("a", 1)  # asking again keeps its place
    budget.count(-1)
    assert budget.should_offer()
    # Room is back, but a and b waited: the flooding connection is refused and queued last.
    assert not budget.admit("flood", 100)
    assert budget.offer() == "a"
    assert budget.admit("a", 1)
    budget.count(1)
    assert budget.offer() is None  # full again: b and flood keep waiting
    budget.count(-1)
    assert [budget.offer(), budget.admit("b", 1)] == ["b", True]
    assert budget.offer() == "flood"
    assert budget.waiting == 0


def test_room_is_what_is_left_and_nothing_while_others_wait_first():
    budget = RequestBudget(max_requests=10, max_bytes=100)
    budget.take(60)
    budget.count(4)
    assert budget.room("a") == (6, 40)
    budget.take(60)  # room is strict, but admit may still go past it (non-strict)
    assert budget.room("a") == (6, 0)
    assert not budget.admit("b", 1)
    budget.finished(120)
    assert budget.room("a") == (0, 0)  # b waits first
    assert budget.offer() == "b" and budget.room("b") == (6, 100)
    assert RequestBudget(10, -1).room("a") == (10, 1 << 62)


def test_a_closed_connection_leaves_the_queue():
    budget = RequestBudget(max_requests=1, max_bytes=-1)
    budget.admit("a", 1)
    budget.count(1)
    budget.admit("b", 1)
    budget.admit("c", 1)
    budget.forget("b")
    budget.count(-1)
    assert budget.offer() == "c"


# --- FrameReader.frames(admit) --------------------------------------------------------------


def framed(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


def receive(reader: FrameReader, data: bytes) -> None:
    target = reader.buffer()
    assert len(target) >= len(data)
    target[:len(data)] = data
    reader.received(len(data))


def test_a_refused_small_frame_stays_uncut_until_a_later_call_takes_it():
    payloads = [b"a" * 10, b"b" * 20, b"c" * 30]
    reader = FrameReader(MiB)
    receive(reader, framed(*payloads))
    asked: list[int] = []

    def admit_two(size: int) -> bool:
        asked.append(size)
        return len(asked) <= 2

    assert reader.frames(0, 0, admit_two) == payloads[:2]
    assert reader.held_back and asked == [10, 20, 30]
    assert reader.buffered == 4 + 30
    assert reader.frames(0, 0, lambda size: True) == payloads[2:]  # no new bytes needed
    assert not reader.held_back and reader.buffered == 0


def test_frames_within_the_allowance_are_taken_without_asking():
    payloads = [b"a" * 10, b"b" * 20, b"c" * 30, b"d" * 40]
    reader = FrameReader(MiB)
    receive(reader, framed(*payloads))
    asked: list[int] = []
    # Two frames and 35 bytes free: a and b without asking; c asked about (refused).
    assert reader.frames(2, 35, lambda size: asked.append(size) or False) == payloads[:2]
    assert reader.free_used == (2, 30) and asked == [30] and reader.held_back
    # The bytes limit holds too; without admit what is over it waits.
    assert reader.frames(5, 29) == []
    assert reader.held_back and reader.free_used == (0, 0)
    assert reader.frames(5, 100) == payloads[2:]
    assert reader.free_used == (2, 70) and not reader.held_back


def test_a_large_frame_gets_no_buffer_until_admitted():
    reader = FrameReader(20 * MiB)
    receive(reader, struct.pack(">i", 20 * MiB) + b"x" * 1000)
    assert reader.frames(0, 0, lambda size: False) == []
    assert reader.held_back and reader.buffered == 1004  # still in the shared receive buffer
    assert reader._frame is None
    asked: list[int] = []
    assert reader.frames(0, 0, lambda size: asked.append(size) or True) == []
    assert asked == [20 * MiB] and not reader.held_back
    assert len(reader._frame) == 20 * MiB and reader.buffered == 1000


def test_the_rest_of_an_admitted_large_frame_is_not_asked_about_again():
    body = b"y" * 200_000
    reader = FrameReader(MiB)
    receive(reader, framed(body)[:50_000])
    assert reader.frames(0, 0, lambda size: True) == []
    target = reader.buffer()
    target[:] = body[50_000 - 4:]
    reader.received(len(target))
    (frame,) = reader.frames(0, 0, lambda size: pytest.fail("asked twice"))
    assert bytes(frame) == body


# --- config ---------------------------------------------------------------------------------------


def test_the_keys_default_to_a_bounded_broker():
    config = BrokerConfig()
    assert config.get("queued.max.requests") == 500  # Kafka's default
    # Kafka's is -1 (no limit); a finite default, twice the largest request, keeps a Python
    # broker's request memory bounded (see README).
    assert config.get("queued.max.request.bytes") == 2 * config.get("socket.request.max.bytes")


@pytest.mark.parametrize("values", [
    {"queued.max.request.bytes": "-1"},
    {"queued.max.request.bytes": "0"},
    {"queued.max.request.bytes": "104857600"},
    {"socket.request.max.bytes": "1000", "queued.max.request.bytes": "1000"},
    {"queued.max.requests": "1"},
])
def test_accepted_values(values):
    BrokerConfig(values)


@pytest.mark.parametrize(("values", "message"), [
    ({"queued.max.requests": "0"}, "queued.max.requests: 0 is outside"),
    ({"queued.max.request.bytes": "-2"}, "queued.max.request.bytes: -2 is outside"),
    ({"queued.max.request.bytes": "104857599"},
     r"queued.max.request.bytes \(104857599\) must be at least socket.request.max.bytes "
     r"\(104857600\), or -1 for no limit"),
    ({"socket.request.max.bytes": "500000000"},
     r"queued.max.request.bytes \(209715200, the default\) must be at least "
     r"socket.request.max.bytes \(500000000\)"),
])
def test_refused_values_say_why(values, message):
    with pytest.raises(ConfigError, match=message):
        BrokerConfig(values)
