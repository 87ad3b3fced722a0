"""No request costs more than linear time in its size (issue 21, "close the class").

For every API the broker serves whose request has arrays (SUPPORTED_VERSIONS, newest
version), a request whose arrays at one level hold BIG elements and one whose arrays there
hold SMALL = BIG / 10, both built from kio's schema: distinct names and ids, the last
element a copy of the first (the duplicate checks run). The event loop's CPU time for the
big request, as a ratio to the small one's, must stay near the size ratio (10), far from its
square (100); a probe connection pings the broker all along and the stall it sees is
printed beside it. Two cases build
state first: an ongoing transaction for AddPartitionsToTxn, and topic and transactional ids
of 23 `a`s for the regexes of ConsumerGroupHeartbeat and ListTransactions, where the big
request is `(a+)+b` (backtracking) and the small one `a+b`.

Each measure is the least of two tries, measured side by side (see _stall).
"""

from __future__ import annotations

import dataclasses
import datetime
import socket
import threading
import time
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)
from support.brokers import loop_cpu
from support.raw_wire import read_frame

from oncelog.protocol.api_versions import SUPPORTED_VERSIONS
from oncelog.protocol.messages import decode_response, encode_request

BIG = 2_000
SMALL = BIG // 10
RATIO_BOUND = 30  # linear: about 10; quadratic: about 100
CPU_FLOOR = 0.001  # what the kernel's accounting resolves, about
TOPIC = "wide"
TOPIC_PARTITIONS = 50
BACKTRACKS = "a" * 23  # (a+)+b against it: 2^23 steps for a backtracking matcher

# Values that keep requests from waiting (a Fetch's max wait, a produce's acks) or from
# changing the broker (CreateTopics validates only).
_FIELD_VALUES: dict[str, Any] = {
    "validate_only": True, "acks": 1, "max_wait": datetime.timedelta(0),
    "min_bytes": 0, "timeout": datetime.timedelta(0), "num_partitions": 1,
    "replication_factor": 1, "config_operation": 0, "resource_type": 2,
}


def _value(field: dataclasses.Field, kafka_type: str, i: int) -> Any:
    if field.name in _FIELD_VALUES:
        return _FIELD_VALUES[field.name]
    if kafka_type in ("int8", "int16"):
        return 0
    if kafka_type in ("int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        return i % TOPIC_PARTITIONS if "partition" in field.name else 1
    if kafka_type == "float64":
        return 1.0
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return uuid.UUID(int=i + 1)
    if kafka_type == "error_code":
        return ErrorCode.none
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, datetime.UTC)
    if kafka_type == "string":
        return f"{field.name}-{i}"
    if kafka_type in ("bytes", "records"):
        return b"x"
    raise TypeError(kafka_type)


def wide(cls: type, n: int, level: int, depth: int = 0, i: int = 0) -> Any:
    """An entity whose arrays at ``level`` hold ``n`` elements (the last a copy of the
    first), every other array one."""
    values = {}
    for field in dataclasses.fields(cls):
        if get_field_tag(field) is not None:
            continue
        kind = classify_field(field)
        if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
            count = n if depth == level else 1
            indexes = [*range(count - 1), 0] if count > 1 else [0]
            if isinstance(kind, EntityTupleField):
                values[field.name] = tuple(wide(kind.type_, n, level, depth + 1, j)
                                           for j in indexes)
            else:
                values[field.name] = tuple(_value(field, field.metadata["kafka_type"], j)
                                           for j in indexes)
        elif isinstance(kind, EntityField):
            values[field.name] = None if is_optional(field) else \
                wide(kind.type_, n, level, depth + 1, i)
        else:
            values[field.name] = _value(field, field.metadata["kafka_type"], i)
    return cls(**values)


def array_depths(cls: type, depth: int = 0) -> set[int]:
    out: set[int] = set()
    for field in dataclasses.fields(cls):
        if get_field_tag(field) is not None:
            continue
        kind = classify_field(field)
        if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
            out.add(depth)
        if isinstance(kind, (EntityTupleField, EntityField)):
            out |= array_depths(kind.type_, depth + 1)
    return out


class Probe:
    """A connection that sends ApiVersions back to back and keeps each round trip."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.trips: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.frame = encode_request(18, 0, 1, "probe", load_request_schema(18, 0)())
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            start = time.perf_counter()
            self.sock.sendall(self.frame)
            read_frame(self.sock)
            self.trips.append((start, time.perf_counter()))

    def stall(self, start: float, end: float) -> float:
        """The longest round trip that overlapped [start, end]."""
        time.sleep(0.01)  # the trip under way at ``end`` finishes
        return max((b - a for a, b in list(self.trips) if b >= start and a <= end),
                   default=end - start)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(120)
        self.sock.close()


def _send(sock: socket.socket, api_key: int, version: int, body: Any) -> None:
    sock.sendall(encode_request(api_key, version, 1, "linear", body))
    decode_response(api_key, version, read_frame(sock))


def _stall(probe: Probe, broker, api_key: int, version: int, make_body
           ) -> tuple[float, float]:
    """(event-loop CPU, stall) of the request, each the least over two tries. The stall is
    the longest probe round trip while it was handled, or its own round trip when longer (a
    short request may fall between two probes): what other clients wait. The loop's CPU is
    what the request cost, whatever else the shared machine runs meanwhile (a long request
    is preempted more often than a short one, which inflates wall-time ratios)."""
    best_cpu = best_stall = float("inf")
    frame = None
    for _ in range(2):
        body = make_body()
        if body is not None or frame is None:  # None: the same frame again
            frame = encode_request(api_key, version, 1, "linear", body)
        with socket.create_connection(("127.0.0.1", broker.port), timeout=120) as sock:
            cpu = loop_cpu(broker.proc.pid)
            start = time.perf_counter()
            sock.sendall(frame)
            read_frame(sock)
            end = time.perf_counter()
            time.sleep(0.005)  # the loop finishes what follows the answer, and is accounted
            best_cpu = min(best_cpu, loop_cpu(broker.proc.pid) - cpu)
            best_stall = min(best_stall, max(end - start, probe.stall(start, end)))
    return best_cpu, best_stall


def _once(make):
    """A body made on the first call; None after it (send the same frame again)."""
    made = []

    def body():
        if made:
            return None
        made.append(True)
        return make()
    return body


def _cases() -> list[tuple[str, int, int, Any, Any]]:
    """(name, api key, version, small body, big body) for every API with arrays."""
    cases = []
    for api_key, (_, version) in sorted(SUPPORTED_VERSIONS.items()):
        schema = load_request_schema(api_key, version)
        for level in sorted(array_depths(schema)):
            cases.append((f"{schema.__name__} v{version} level {level}", api_key, version,
                          _once(lambda s=schema, lv=level: wide(s, SMALL, lv)),
                          _once(lambda s=schema, lv=level: wide(s, BIG, lv))))
    return cases


@pytest.fixture
def stage(broker):
    """The broker with a topic, an ongoing transaction and ids of 23 `a`s."""
    from support.brokers import create_topic
    create_topic(broker.bootstrap, TOPIC, TOPIC_PARTITIONS)
    create_topic(broker.bootstrap, BACKTRACKS)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=60) as sock:
        init = load_request_schema(22, 4)
        for tid in ("linear-txn", BACKTRACKS):
            sock.sendall(encode_request(22, 4, 1, "linear", init(
                transactional_id=tid, transaction_timeout=datetime.timedelta(seconds=60),
                producer_id=-1, producer_epoch=-1)))
            _, answer = decode_response(22, 4, read_frame(sock))
            if tid == "linear-txn":
                producer = (answer.producer_id, answer.producer_epoch)
    return broker, producer


def _special_cases(producer: tuple[int, int]) -> list[tuple[str, int, int, Any, Any]]:
    add = load_request_schema(24, 3)
    mod = __import__(add.__module__, fromlist=["x"])

    def add_partitions(n: int):
        # n partitions: the topic's 50, then ones it does not have
        return add(v3_and_below_transactional_id="linear-txn",
                   v3_and_below_producer_id=producer[0],
                   v3_and_below_producer_epoch=producer[1],
                   v3_and_below_topics=(mod.AddPartitionsToTxnTopic(
                       name=TOPIC, partitions=tuple(range(n))),))

    cgh = load_request_schema(68, 1)

    def heartbeat(regex: str):
        # a new group each time: a group keeps what its regexes matched for a while
        return cgh(group_id=f"linear-{uuid.uuid4()}", member_id=str(uuid.uuid4()),
                   member_epoch=0,
                   instance_id=None, rack_id=None,
                   rebalance_timeout=datetime.timedelta(seconds=30),
                   subscribed_topic_names=None, subscribed_topic_regex=regex,
                   server_assignor=None, topic_partitions=())

    lt_version = SUPPORTED_VERSIONS[66][1]
    lt = load_request_schema(66, lt_version)

    def list_transactions(pattern: str):
        return lt(state_filters=(), producer_id_filters=(), duration_filter=-1,
                  transactional_id_pattern=pattern)

    cases = [
        # larger: its quadratic cost shows past a few thousand partitions
        ("AddPartitionsToTxn v3, an ongoing transaction", 24, 3,
         _once(lambda: add_partitions(6 * SMALL)), _once(lambda: add_partitions(6 * BIG))),
        ("ConsumerGroupHeartbeat v1 SubscribedTopicRegex", 68, 1,
         lambda: heartbeat("a+b"), lambda: heartbeat("(a+)+b")),
    ]
    if lt_version >= 2:
        cases.append(("ListTransactions transactional_id_pattern", 66, lt_version,
                      _once(lambda: list_transactions("a+b")),
                      _once(lambda: list_transactions("(a+)+b"))))
    return cases


def test_every_request_costs_linear_time(stage):
    broker, producer = stage
    cases = _cases() + _special_cases(producer)
    probe = Probe(broker.port)
    slow = []
    try:
        for name, api_key, version, small, big in cases:
            small_cpu, small_stall = _stall(probe, broker, api_key, version, small)
            big_cpu, big_stall = _stall(probe, broker, api_key, version, big)
            ratio = big_cpu / max(small_cpu, CPU_FLOOR)
            print(f"{name}: loop CPU {small_cpu * 1000:.1f} -> {big_cpu * 1000:.1f} ms "
                  f"(x{ratio:.1f}); probe stall {small_stall * 1000:.1f} -> "
                  f"{big_stall * 1000:.1f} ms (x{big_stall / small_stall:.1f})")
            if ratio > RATIO_BOUND:
                slow.append(f"{name}: x{ratio:.1f}")
    finally:
        probe.close()
    assert not slow, f"more than linear (ratio > {RATIO_BOUND}): {slow}"
