"""Backpressure against a real broker: clients that never read their answers, flood requests
or announce huge requests and send them slowly leave the broker's memory bounded by its
limits (RSS read from /proc), other clients are served meanwhile, and once the bad clients
are gone the broker's own counters (/metrics) show that everything was given back.

The RSS bounds are generous sums of what the limits allow (read-ahead, one answer per
connection, the request budget) plus a fixed slack for the allocator and the normal client;
what the hostile clients ask for is many times more. Nothing here waits on a clock: each step
waits (bounded) for a condition the broker reports.
"""

from __future__ import annotations

import struct
import threading
import time

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from support.brokers import create_topic
from support.hostile_clients import (
    ProduceFlood,
    announce_frames,
    connect,
    fetch_frame,
    fill,
    hoard_fetches,
    metrics,
    normal_round_trip,
    peak_rss,
    produce_frame,
    reset_peak_rss,
    rss,
    wait_for_metrics,
)

from oncelog.broker.server import _READ_AHEAD_BYTES, _WRITE_HIGH
from oncelog.protocol.frame_check import check_request
from oncelog.protocol.messages import (
    DECODED_BYTES_PER_ELEMENT,
    decode_response,
    encode_request,
)

MiB = 1 << 20
SLACK = 32 * MiB  # allocator, the normal client's requests, interpreter noise
IO_TIMEOUT = 30.0


def everything_given_back(samples: dict[str, float]) -> bool:
    return all(samples[name] == 0 for name in (
        "oncelog_connections", "oncelog_queued_requests", "oncelog_queued_request_bytes",
        "oncelog_unsent_response_bytes", "oncelog_connections_waiting_for_reader",
        "oncelog_connections_waiting_for_budget"))


def read_frame(sock) -> bytes:
    def exactly(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "connection closed"
            buf += chunk
        return bytes(buf)

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def assert_growth_within(pid: int, baseline: int, bound: int, what: str) -> None:
    growth = peak_rss(pid) - baseline
    print(f"{what}: peak RSS grew by {growth / MiB:.1f} MiB (bound {bound / MiB:.1f} MiB)")
    assert growth <= bound, (f"{what}: the broker's peak RSS grew by {growth / MiB:.1f} MiB, "
                             f"over the bound of {bound / MiB:.1f} MiB")


HOARDERS = 4
FETCHES = 50


def test_unread_fetch_answers_stop_the_connection_not_the_broker(start_broker):
    # queued.max.requests well under what the hoarders pipeline: requests behind unread
    # answers must not count, or they would stop the broker from reading anyone else.
    broker = start_broker(queued_max_requests=20)
    for topic in ("hoard", "normal"):
        create_topic(broker.bootstrap, topic)
    fill(broker.bootstrap, "hoard", 4000)
    with connect(broker.port) as sock:  # the size of one answer: the whole partition
        sock.sendall(fetch_frame("hoard", 50_000_000, 0))
        answer = len(read_frame(sock)) + 4
    assert answer > 4_000_000
    pid = broker.proc.pid
    baseline = rss(pid)
    reset_peak_rss(pid)

    # (a) Each hoarder asks for 50 answers of 4 MB (800 MB in all) and reads none of them.
    socks = [hoard_fetches(broker.port, "hoard", FETCHES, 50_000_000) for _ in range(HOARDERS)]
    try:
        wait_for_metrics(broker.metrics_port,
                         lambda m: m["oncelog_connections_waiting_for_reader"] == HOARDERS,
                         what="every hoarder's connection to stop")
        # (b) Meanwhile a normal client produces and consumes.
        normal_round_trip(broker.bootstrap, "normal")
        samples = metrics(broker.metrics_port)
        assert samples["oncelog_connections_waiting_for_reader"] == HOARDERS
        assert samples["oncelog_unsent_response_bytes"] <= HOARDERS * (answer + 2 * _WRITE_HIGH)
        assert samples["oncelog_queued_requests"] == 0  # they wait for their clients
        assert samples["oncelog_queued_request_bytes"] <= HOARDERS * _READ_AHEAD_BYTES
        # Per hoarder: the answer in the making (its log read and its encoding), the one
        # left unsent, and the requests read ahead.
        bound = HOARDERS * (3 * answer + _READ_AHEAD_BYTES) + SLACK
        assert HOARDERS * FETCHES * answer > 8 * bound  # what the test would catch
        assert_growth_within(pid, baseline, bound, "hoarded fetches")
    finally:
        for sock in socks:
            sock.close()
    # (d) Once they are gone, the broker holds nothing for them.
    wait_for_metrics(broker.metrics_port, everything_given_back, what="everything given back")


def test_a_produce_flood_is_read_no_faster_than_it_is_handled(start_broker):
    broker = start_broker()
    for topic in ("wake", "normal"):
        create_topic(broker.bootstrap, topic)
    pid = broker.proc.pid
    baseline = rss(pid)
    reset_peak_rss(pid)
    # Requests of 900 KB to a topic that does not exist: read and refused whole, never stored,
    # so the flood costs the broker memory and CPU but no disk.
    frame = produce_frame("no-such-topic", 900_000)
    size = len(frame) - 4
    # First a Fetch that waits for data on "wake": what the flood sends queues behind it.
    head = fetch_frame("wake", MiB, 0, max_wait_ms=120_000)
    with ProduceFlood(broker.port, frame, connections=HOARDERS, head=head) as flood:
        # (c) Each connection reads one request ahead of its waiting Fetch, no more; the rest
        # of what the flood writes stays in the kernel.
        # the Fetch (its frame and, as it waits, its decoded objects) and one request, on each
        decoded = DECODED_BYTES_PER_ELEMENT * check_request(head[4:], 1, 12).elements
        held = HOARDERS * (size + len(head) - 4 + decoded)
        samples = wait_for_metrics(broker.metrics_port,
                                   lambda m: m["oncelog_queued_request_bytes"] == held,
                                   what="a request read ahead on every flooding connection")
        assert samples["oncelog_queued_requests"] == 0  # they wait for the Fetch
        assert 2 * size > _READ_AHEAD_BYTES  # hence one, not more
        normal_round_trip(broker.bootstrap, "normal")
        bound = HOARDERS * (_READ_AHEAD_BYTES + size) + SLACK
        assert_growth_within(pid, baseline, bound, "a flood queued behind a Fetch")
        assert flood.sent < 1000  # the kernel took a few; the broker took one per connection

        # Wake the Fetches: now the broker handles the flood as fast as it can, and the
        # normal client still gets its turn.
        fill(broker.bootstrap, "wake", 1)
        sent = flood.sent
        deadline = time.monotonic() + IO_TIMEOUT
        while flood.sent < sent + 200:
            assert time.monotonic() < deadline, "the flood did not get going again"
            time.sleep(0.05)
        normal_round_trip(broker.bootstrap, "normal")
        assert flood.sent > sent + 200 and not flood.errors
        assert_growth_within(pid, baseline, bound, "a flood handled at full speed")
    wait_for_metrics(broker.metrics_port, everything_given_back, what="everything given back")


def test_slow_senders_of_large_requests_hold_no_more_than_the_budget(start_broker):
    frame_max, budget = 16 * MiB, 32 * MiB
    broker = start_broker(socket_request_max_bytes=frame_max, queued_max_request_bytes=budget)
    pid = broker.proc.pid
    baseline = rss(pid)
    reset_peak_rss(pid)
    # Six connections each announce a request of the largest size and send 1 KiB of it.
    slow = [announce_frames(broker.port, frame_max) for _ in range(6)]
    try:
        samples = wait_for_metrics(
            broker.metrics_port, lambda m: m["oncelog_connections_waiting_for_budget"] == 4,
            what="four slow senders waiting for the budget")
        assert samples["oncelog_queued_request_bytes"] == budget  # two buffers, no more
        assert_growth_within(pid, baseline, budget + frame_max + 8 * MiB, "slow senders")

        # A newcomer waits its turn too (the budget is Kafka's: no reading while it is spent)
        # and is served once room is made.
        with connect(broker.port) as sock:
            sock.sendall(encode_request(18, 3, 42, "newcomer", ApiVersionsRequest(
                client_software_name="t", client_software_version="1")))
            wait_for_metrics(broker.metrics_port,
                             lambda m: m["oncelog_connections_waiting_for_budget"] == 5,
                             what="the newcomer queued behind the slow senders")
            for sock_ in slow[:2]:
                sock_.close()
            # The first two waiters get the room, in their order; the others still wait.
            samples = wait_for_metrics(
                broker.metrics_port, lambda m: m["oncelog_connections_waiting_for_budget"] == 3,
                what="the next two slow senders admitted")
            assert samples["oncelog_queued_request_bytes"] == budget
            for sock_ in slow[2:]:
                sock_.close()
            correlation_id, answer = decode_response(18, 3, read_frame(sock))
            assert correlation_id == 42 and answer.error_code == 0
    finally:
        for sock_ in slow:
            sock_.close()
    wait_for_metrics(broker.metrics_port, everything_given_back, what="everything given back")


@pytest.mark.parametrize("flush_messages", [None, 1], ids=["no-fsync", "fsync-each"])
def test_pipelined_answers_stay_in_order_through_pauses(start_broker, flush_messages):
    """Fetches with big answers, produces (with an fsync each, the produce handler waits for
    it) and ApiVersions, all pipelined on one connection whose client reads nothing until it
    has written everything."""
    settings = {} if flush_messages is None else {"log_flush_interval_messages": flush_messages}
    broker = start_broker(**settings)
    create_topic(broker.bootstrap, "ordered")
    fill(broker.bootstrap, "ordered", 300)  # about 300 KB: every Fetch answer is that big
    requests = 300
    versions = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    kinds = {0: (1, 12), 1: (0, 9), 2: (18, 3)}  # i % 3 -> (api key, version)
    frames = [fetch_frame("ordered", MiB, i) if i % 3 == 0
              else produce_frame("ordered", 1000, acks=-1, correlation_id=i) if i % 3 == 1
              else encode_request(18, 3, i, "t", versions) for i in range(requests)]
    with connect(broker.port, rcvbuf=64 * 1024) as sock:
        # Everything is written before anything is read: the broker must stop and go on.
        sender = threading.Thread(target=sock.sendall, args=(b"".join(frames),), daemon=True)
        sender.start()
        wait_for_metrics(broker.metrics_port,
                         lambda m: m["oncelog_connections_waiting_for_reader"] == 1,
                         what="the connection to stop while its answers are unread")
        offsets = []
        for i in range(requests):
            api, version = kinds[i % 3]
            correlation_id, body = decode_response(api, version, read_frame(sock))
            assert correlation_id == i
            if api == 0:
                (part,) = body.responses[0].partition_responses
                assert part.error_code == 0
                offsets.append(part.base_offset)
            else:
                assert body.error_code == 0
        assert offsets == sorted(offsets) and len(set(offsets)) == requests // 3
        sender.join(IO_TIMEOUT)
        assert not sender.is_alive()
    samples = wait_for_metrics(broker.metrics_port, everything_given_back,
                               what="everything given back")
    assert samples["oncelog_write_pauses_total"] >= 1
