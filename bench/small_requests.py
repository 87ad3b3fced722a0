"""The broker's CPU per small request, for two source trees in one run (issue 26).

Round trips a consumer makes one at a time: a synchronous OffsetCommit
(``commit(asynchronous=False)``) and an OffsetFetch (``committed()``) from confluent-kafka,
and a Heartbeat of a member that joined a group (oncelog's own connection, the version
librdkafka sends: v4); then confluent-kafka producing 1 KiB values in 16 KiB batches
(``batch.size=16384``, about 15 values a Produce), per value. The broker's on-CPU time (its
threads' schedstat) over ``--calls`` of each, divided by the calls, is the figure: it holds
up on a busy machine far better than a rate does. The trees take turns, in alternating order,
``--repeats`` times, each with a fresh broker; medians (and min..max) are printed.

Then, in process, CPU time: decoding typical small requests the general way (frame check + kio's
reader) and with protocol/fast_reader.py; the coordinator's one-record append
(encode_batch + Partition.append_records) in a process of each tree; encoding typical small
answers with kio's writer and with protocol/fast_writer.py (best of 5 x 5,000 each).

    .venv/bin/python bench/small_requests.py [--src /tmp/zc-base/src] [--calls 2000 --repeats 4]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import io
import os
import subprocess
import sys
import time
import timeit
from pathlib import Path

from _support import REPO, OncelogBroker, cpu_seconds_probe, median
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT = 30.0
KINDS = ("OffsetCommit", "OffsetFetch", "Heartbeat", "Produce 16 KiB, per value")
VALUE = bytes(range(256)) * 4


def _member(broker: OncelogBroker):
    """A connection holding a member of group ``beat``, and its Heartbeat."""
    from kio.schema.errors import ErrorCode

    from oncelog.client.network.connection import BrokerConnection
    from oncelog.protocol.schema import build

    conn = BrokerConnection("127.0.0.1", broker.port, client_id="bench")
    second = datetime.timedelta(seconds=30)

    def join(member_id: str):
        return conn.call(11, lambda mod, v: build(
            mod.JoinGroupRequest, group_id="beat", session_timeout=second,
            rebalance_timeout=second, member_id=member_id, group_instance_id=None,
            protocol_type="consumer", reason=None,
            protocols=(build(mod.JoinGroupRequestProtocol, name="range", metadata=b""),)))

    joined = join("")
    if joined.error_code == ErrorCode.member_id_required:
        joined = join(joined.member_id)
    assert joined.error_code == ErrorCode.none, joined
    member, generation = joined.member_id, joined.generation_id
    synced = conn.call(14, lambda mod, v: build(
        mod.SyncGroupRequest, group_id="beat", generation_id=generation, member_id=member,
        group_instance_id=None, protocol_type="consumer", protocol_name="range",
        assignments=(build(mod.SyncGroupRequestAssignment, member_id=member,
                           assignment=b""),)))
    assert synced.error_code == ErrorCode.none, synced

    def beat(_: int) -> None:
        answer = conn.call(12, lambda mod, v: build(
            mod.HeartbeatRequest, group_id="beat", generation_id=generation,
            member_id=member, group_instance_id=None))
        assert answer.error_code == ErrorCode.none, answer
    return conn, beat


def _produce_16k(broker: OncelogBroker):
    producer = Producer({"bootstrap.servers": broker.bootstrap, "batch.size": 16384,
                         "linger.ms": 5, "acks": "all"})

    def produce(_: int) -> None:
        while True:
            try:
                producer.produce("small", VALUE, partition=0)
                return
            except BufferError:
                producer.poll(0.01)
    return producer, produce


def measure(src: Path, calls: int) -> dict[str, float]:
    """Broker CPU microseconds per round trip (per value produced) of each kind, for the tree
    at ``src``."""
    found = {}
    with OncelogBroker({"group.initial.rebalance.delay.ms": "0"}, src=src) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("small", 1, 1)])["small"].result(TIMEOUT)
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "small",
                             "enable.auto.commit": False})
        tp = TopicPartition("small", 0)
        conn, beat = _member(broker)
        producer, produce = _produce_16k(broker)
        try:
            consumer.assign([TopicPartition("small", 0, 0)])
            runs = {
                "OffsetCommit": lambda i: consumer.commit(
                    offsets=[TopicPartition("small", 0, i)], asynchronous=False),
                "OffsetFetch": lambda i: consumer.committed([tp], TIMEOUT),
                "Heartbeat": beat,
            }
            cpu = cpu_seconds_probe(broker.pid)
            for kind in KINDS[:3]:
                call = runs[kind]
                for i in range(200):  # warm: the topic, the coordinator, the code paths
                    call(i)
                before = cpu()
                for i in range(calls):
                    call(i)
                found[kind] = 1e6 * (cpu() - before) / calls
            values = 20 * calls
            for i in range(2000):
                produce(i)
            producer.flush(TIMEOUT)
            before = cpu()
            for i in range(values):
                produce(i)
            assert producer.flush(TIMEOUT) == 0
            found[KINDS[3]] = 1e6 * (cpu() - before) / values
        finally:
            consumer.close()
            conn.close()
    return found


def _answers() -> dict[str, object]:
    from kio.schema.errors import ErrorCode

    from oncelog.protocol.schema import build, response_module

    zero = datetime.timedelta(0)
    commit = response_module(8, 8)
    fetch_offsets = response_module(9, 7)
    fetch = response_module(1, 12)
    beat = response_module(12, 4)
    partition = build(fetch.PartitionData, partition_index=0, error_code=ErrorCode.none,
                      high_watermark=100, last_stable_offset=100, log_start_offset=0,
                      aborted_transactions=(), preferred_read_replica=-1, records=b"x" * 500)
    return {
        "OffsetCommit v8": build(commit.OffsetCommitResponse, throttle_time=zero, topics=(
            build(commit.OffsetCommitResponseTopic, name="small", partitions=(
                build(commit.OffsetCommitResponsePartition, partition_index=0,
                      error_code=ErrorCode.none),)),)),
        "OffsetFetch v7": build(fetch_offsets.OffsetFetchResponse, throttle_time=zero,
                                error_code=ErrorCode.none, topics=(
            build(fetch_offsets.OffsetFetchResponseTopic, name="small", partitions=(
                build(fetch_offsets.OffsetFetchResponsePartition, partition_index=0,
                      committed_offset=5, committed_leader_epoch=-1, metadata="",
                      error_code=ErrorCode.none),)),)),
        "Heartbeat v4": build(beat.HeartbeatResponse, throttle_time=zero,
                              error_code=ErrorCode.none),
        "Fetch v12, 500 B": build(fetch.FetchResponse, throttle_time=zero,
                                  error_code=ErrorCode.none, session_id=0, responses=(
            build(fetch.FetchableTopicResponse, topic="small", partitions=(partition,)),)),
    }


def encode_costs() -> None:
    from kio.serial import entity_writer

    from oncelog.protocol.fast_writer import writer

    print("\nencoding an answer's body, in process, CPU (best of 5 x 5,000):")
    for name, body in _answers().items():
        costs = []
        for write in (entity_writer(type(body)), writer(type(body))):
            def once(write=write, body=body) -> None:
                write(io.BytesIO(), body)
            costs.append(min(timeit.repeat(once, number=5000, repeat=5,
                                           timer=time.process_time)) / 5000 * 1e6)
        print(f"  {name:17} kio {costs[0]:5.1f} us, fast_writer {costs[1]:5.1f} us "
              f"({costs[1] / costs[0]:.2f})")


def _requests() -> dict[str, bytes]:
    """Request frames (without their size prefix) as librdkafka sends them."""
    from oncelog.protocol.messages import encode_request
    from oncelog.protocol.schema import build, request_module

    commit, fetch_offsets = request_module(8, 9), request_module(9, 9)
    beat, fetch = request_module(12, 4), request_module(1, 16)
    member = "rdkafka-6a1f2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    bodies = {
        "OffsetCommit v9": (8, 9, build(
            commit.OffsetCommitRequest, group_id="small", generation_id_or_member_epoch=1,
            member_id=member, group_instance_id=None, topics=(build(
                commit.OffsetCommitRequestTopic, name="small", partitions=(build(
                    commit.OffsetCommitRequestPartition, partition_index=0,
                    committed_offset=5, committed_leader_epoch=-1,
                    committed_metadata=""),)),))),
        "OffsetFetch v9": (9, 9, build(
            fetch_offsets.OffsetFetchRequest, require_stable=True, groups=(build(
                fetch_offsets.OffsetFetchRequestGroup, group_id="small", member_id=None,
                member_epoch=-1, topics=(build(
                    fetch_offsets.OffsetFetchRequestTopics, name="small",
                    partition_indexes=(0,)),)),))),
        "Heartbeat v4": (12, 4, build(beat.HeartbeatRequest, group_id="small",
                                      generation_id=1, member_id=member,
                                      group_instance_id=None)),
        "Fetch v16, 1 partition": (1, 16, build(
            fetch.FetchRequest, replica_id=-1, max_wait=datetime.timedelta(milliseconds=500),
            min_bytes=1, max_bytes=52428800, isolation_level=0, session_id=0,
            session_epoch=-1, rack_id="", forgotten_topics_data=(), topics=(build(
                fetch.FetchTopic, topic_id=__import__("uuid").uuid4(), partitions=(build(
                    fetch.FetchPartition, partition=0, current_leader_epoch=-1,
                    fetch_offset=100, last_fetched_epoch=-1, log_start_offset=-1,
                    partition_max_bytes=1048576),)),))),
    }
    return {name: encode_request(key, version, 7, "rdkafka", body)[4:]
            for name, (key, version, body) in bodies.items()}


def decode_costs() -> None:
    from oncelog.protocol.messages import decode_general, decode_request, peek_header

    print("\ndecoding a request, in process, CPU (best of 5 x 5,000):")
    for name, frame in _requests().items():
        key, version, correlation = peek_header(frame)
        costs = []
        general = functools.partial(decode_general, frame, key, version, correlation)
        for decode in (general, functools.partial(decode_request, frame)):
            costs.append(min(timeit.repeat(decode, number=5000, repeat=5,
                                           timer=time.process_time)) / 5000 * 1e6)
        print(f"  {name:22} general {costs[0]:5.1f} us, fast_reader {costs[1]:5.1f} us "
              f"({costs[1] / costs[0]:.2f})")


def append_cost() -> float:
    """Microseconds of CPU for the coordinator's one-record append, as
    InternalTopicLog.append_at makes it, with whichever oncelog is on the path."""
    import tempfile

    from oncelog.broker.log_dirs import LogDir
    from oncelog.broker.partition import Partition
    from oncelog.log.log import LogConfig
    from oncelog.producer_state.manager import StateLimits
    from oncelog.protocol.records import encode_batch, now_ms

    class Issued:
        def is_issued(self, producer_id: int) -> bool:
            return True

        def highest_claimed(self) -> int:
            return 0

    with tempfile.TemporaryDirectory() as root:
        partition = Partition("__consumer_offsets", 0, f"{root}/__consumer_offsets-0",
                              LogConfig(), 1 << 20, StateLimits(), Issued(),
                              log_dir=LogDir(root))
        key, value = b"\x00\x01\x00\x05small\x00\x05small\x00\x00\x00\x00", bytes(40)

        def once() -> None:
            partition.append_records(encode_batch([(key, value, (), now_ms())]))
        cost = min(timeit.repeat(once, number=5000, repeat=5, timer=time.process_time))
        partition.close()
    return cost / 5000 * 1e6


def append_costs(trees: dict[str, Path], repeats: int) -> None:
    """append_cost in a process of each tree, the trees taking turns; the best of each."""
    found: dict[str, list[float]] = {name: [] for name in trees}
    for r in range(repeats):
        for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
            env = {**os.environ, "PYTHONPATH": str(trees[name])}
            done = subprocess.run([sys.executable, __file__, "--append-only"], env=env,
                                  capture_output=True, text=True, timeout=300, check=True)
            found[name].append(float(done.stdout))
    line = ", ".join(f"{name} {min(costs):.1f} us" for name, costs in found.items())
    if "other" in found:
        line += f" (this/other {min(found['this']) / min(found['other']):.2f})"
    print(f"\nthe coordinator's one-record append (encode_batch + append_records), CPU, "
          f"best of {repeats} processes: {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, help="another tree's src/ to compare with")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--append-only", action="store_true", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)  # run_all.py may pass other modules' options
    if args.append_only:  # a child of append_costs
        print(append_cost())
        return 0
    trees = {"this": REPO / "src"}
    if args.src is not None:
        trees["other"] = args.src
    found: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(args.repeats):
        for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
            found[name].append(measure(trees[name], args.calls))
            print(f"  {name:5} #{r + 1}: " + ", ".join(
                f"{k} {v:5.1f} us" for k, v in found[name][-1].items()), flush=True)
    print(f"\nbroker CPU per round trip, median of {args.repeats} (min..max):")
    for kind in KINDS:
        line = f"  {kind:25}"
        for name in trees:
            values = [run[kind] for run in found[name]]
            line += f"  {name} {median(values):5.1f} us ({min(values):.1f}..{max(values):.1f})"
        if "other" in trees:
            ratio = median([r[kind] for r in found["this"]]) / \
                median([r[kind] for r in found["other"]])
            line += f"  this/other {ratio:.2f}"
        print(line)
    decode_costs()
    append_costs(trees, 3)
    encode_costs()
    return 0


if __name__ == "__main__":
    sys.exit(main())
