"""Consumer groups: oncelog's group coordinator next to librdkafka's mock cluster, in one run.

    .venv/bin/python bench/groups.py [--repeats R] [--parts join,commit,consume,memory]
        [--members 10] [--commit-seconds 3] [--messages 3000000] [--groups 10000]
        [--max-other-load 0.10] [--wait-quiet S] [--src DIR] [--json PATH]
    make bench ARGS="--only groups"

``--src DIR`` (another checkout's ``src/``, or its root) adds its broker to the join and
commit parts as one more target, ``oncelog (--src)``, run beside this tree's and the mock in
the same repetitions, in turn: an A/B of two commits on the same machine in the same minutes,
with the median of the per-repetition ratios this tree / the other. Build the other's codec
first (``setup.py build_ext --inplace`` in it). consume and memory measure this tree only.

Every client is confluent-kafka with its defaults unless said otherwise; the mock cluster is
librdkafka's (``test.mock.num.brokers=1``), which serves the classic group protocol. oncelog
and the mock take turns within each repetition, in alternating order; medians are reported
with the median of the per-repetition ratios ("paired"). The CPU other processes use is
measured during every run, and repetitions with a run above ``--max-other-load`` are left
out of the medians when at least 3 remain (the report says how many were used).

* join: time from the first of ``--members`` consumers calling ``subscribe()`` (roundrobin
  assignor) on topics of 4 partitions (the mock's size: it has no CreateTopics), enough of
  them for every member to get a partition, until every member holds some (librdkafka
  revokes everything when a rebalance starts, so all holding some and no partition twice
  means all are in the final generation), polled in a tight loop. The mock waits 3 s after a group's
  first join for more members (its ``group.initial.rebalance.delay.ms``, settable only
  through the C API, not from Python) and then completes without waiting further. oncelog
  runs with ``group.initial.rebalance.delay.ms=0`` (goal: <= 1.0x the mock's time) and, for
  reference, with 100 ms and with Kafka's default 3000, which like Kafka waits another delay
  whenever members joined during one.
* commit: one consumer of a group (subscribed to a 4-partition topic) commits an explicit
  offset synchronously (``commit(offsets=..., asynchronous=False)``) again and again for
  ``--commit-seconds``: round trips per second (goal: oncelog >= 0.8x the mock). The same
  consumer reading its committed offset (``committed()``, OffsetFetch) is measured alike, as
  the floor of a group request's round trip on each.
* consume (oncelog only): one consumer reads ``--messages`` 100-byte records from a topic of 4
  partitions with ``assign()`` (from offset 0) and with ``subscribe()`` (a new group each
  time, ``auto.offset.reset=earliest``, auto commit on as by default), both with
  ``fetch.queue.backoff.ms=10`` (librdkafka's 1000 ms default paces a reader that empties
  its queue quickly to a few hundred thousand records a second, whatever the broker).
  Throughput over the last 80% of the records (goal: subscribe >= 0.95x assign), the time
  from the call to the first record and to the last.
* memory (oncelog only): ``--groups`` groups of one member each are made over the protocol
  (JoinGroup twice, as KIP-394 asks, then SyncGroup, 500 requests pipelined per round on one
  connection), then each member commits one offset. The broker process's RSS (VmRSS from
  /proc) is read before (after 100 warm-up groups), after the joins and after the commits:
  bytes per group. The time to serve /metrics with all of them is reported too.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys
import time
import urllib.request
from pathlib import Path

from _support import (
    LoadMeter,
    MockCluster,
    OncelogBroker,
    add_json_argument,
    add_parts_argument,
    add_quiet_arguments,
    cpu_seconds_probe,
    machine,
    median,
    source_tree,
    wait_if_asked,
    write_json,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import hostile_clients  # tests/: the broker's RSS from /proc

PARTS = ("join", "commit", "consume", "memory")
RUN_TIMEOUT = 120.0
JOIN_GOAL = 1.0  # oncelog / mock, at most
COMMIT_GOAL = 0.8  # oncelog / mock, at least
CONSUME_GOAL = 0.95  # subscribe / assign, at least
OTHER = "oncelog (--src)"  # the target of another checkout's broker
NO_DELAY = {"group.initial.rebalance.delay.ms": "0"}
SHORT_DELAY = {"group.initial.rebalance.delay.ms": "100"}
# librdkafka 2.x stops fetching for fetch.queue.backoff.ms (1000) once its queue holds
# queued.min.messages: a reader that empties the queue quickly then waits a second at a time.
CONSUME_CONF = {"fetch.queue.backoff.ms": 10}
MOCK_PARTITIONS = 4


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def mock_sized_topic(bootstrap: str, topic: str, is_mock: bool) -> None:
    """A topic of MOCK_PARTITIONS partitions: the mock has no CreateTopics and auto-creates
    topics with that many (its default, settable only through the C API)."""
    from oncelog.client.admin.admin import Admin

    if not is_mock:
        create_topic(bootstrap, topic, MOCK_PARTITIONS)
        return
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        found = admin.metadata([topic], auto_create=True).topics[topic]
    if len(found.partitions) != MOCK_PARTITIONS:
        raise RuntimeError(f"the mock made {topic} with {len(found.partitions)} partitions")


def _consumer(bootstrap: str, group: str, **extra):
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, **extra})


def rounds(args, targets: dict, ours) -> list[dict]:
    """``args.repeats`` repetitions; in each every target (name -> function of the repetition
    number returning a dict of results) runs once, the order alternating. Each result gets
    ``others``: the share of the CPUs other processes used meanwhile (``ours`` gives the CPU
    seconds of the brokers we started, which are not others)."""
    reps = []
    for rep in range(args.repeats):
        names = list(targets) if rep % 2 == 0 else list(reversed(targets))
        row = {}
        for name in names:
            meter = LoadMeter(ours)
            row[name] = {**targets[name](rep), "others": meter.others_share()}
        reps.append(row)
    return reps


def summarize(reps: list[dict], key: str, max_other_load: float,
              pair: tuple[str, str] | None = None) -> dict:
    """Medians of ``key`` over the repetitions in which no run had other processes above
    ``max_other_load`` of the CPUs (over all of them when fewer than 3 are that quiet), and
    with ``pair`` the median of the per-repetition ratios pair[0] / pair[1]."""
    quiet = [r for r in reps if max(run["others"] for run in r.values()) <= max_other_load]
    used = quiet if len(quiet) >= 3 else reps
    out = {"used": len(used), "of": len(reps), "only_quiet": used is quiet,
           "median": {name: median([r[name][key] for r in used]) for name in reps[0]}}
    if pair:
        out["paired_ratio"] = median([r[pair[0]][key] / r[pair[1]][key] for r in used])
    return out


def _log(part: str, rep: int, row: dict, show) -> None:
    for name, run in row.items():
        print(f"  {part} rep {rep + 1} {name}: {show(run)} (others {run['others']:.0%})",
              file=sys.stderr, flush=True)


# --- join -------------------------------------------------------------------------------------

def join_seconds(bootstrap: str, topics: list[str], group: str, members: int) -> float:
    consumers = [_consumer(bootstrap, group, **{"client.id": f"member-{i}",
                                                "partition.assignment.strategy": "roundrobin"})
                 for i in range(members)]
    partitions = MOCK_PARTITIONS * len(topics)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        start = time.perf_counter()
        for c in consumers:
            c.subscribe(topics)
        while True:
            held = [len(c.assignment()) for c in consumers]
            if all(held) and sum(held) == partitions:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{group}: no full assignment in {RUN_TIMEOUT} s")
            for c in consumers:
                c.poll(0)
            time.sleep(0.001)
        return time.perf_counter() - start
    finally:
        for c in consumers:
            c.close()


def run_join(args, targets: dict[str, str], ours) -> dict:
    # Enough 4-partition topics that roundrobin gives every member a partition.
    topics = [f"join-topic-{i}" for i in range(-(-args.members // MOCK_PARTITIONS))]
    for name, bootstrap in targets.items():
        for topic in topics:
            mock_sized_topic(bootstrap, topic, name == "mock")
        join_seconds(bootstrap, topics, "warm-up", 1)  # the offsets topic, connections

    def target(bootstrap: str):
        return lambda rep: {"seconds": join_seconds(bootstrap, topics, f"join-{rep}",
                                                    args.members)}

    reps = rounds(args, {name: target(b) for name, b in targets.items()}, ours)
    for rep, row in enumerate(reps):
        _log("join", rep, row, lambda run: f"{run['seconds']:.3f} s")
    return {"runs": reps, **summarize(reps, "seconds", args.max_other_load,
                                      ("oncelog", "mock"))}


# --- commit -----------------------------------------------------------------------------------

def round_trips_per_second(bootstrap: str, topic: str, group: str, seconds: float,
                           call: str = "commit") -> float:
    """One subscribed consumer: synchronous commits (OffsetCommit) or, for reference, reads
    of its committed offset (OffsetFetch), back to back for ``seconds``."""
    from confluent_kafka import TopicPartition

    consumer = _consumer(bootstrap, group, **{"enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + RUN_TIMEOUT
        while not consumer.assignment():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{group}: no assignment in {RUN_TIMEOUT} s")
            consumer.poll(0.01)
        done = 0
        start = time.perf_counter()
        end = start + seconds
        while (now := time.perf_counter()) < end:
            if call == "commit":
                consumer.commit(offsets=[TopicPartition(topic, 0, done)], asynchronous=False)
            else:
                consumer.committed([TopicPartition(topic, 0)], RUN_TIMEOUT)
            done += 1
        return done / (now - start)
    finally:
        consumer.close()


def run_commit(args, targets: dict[str, str], pids: dict[str, int]) -> dict:
    """``pids``: the broker process of each oncelog target, whose CPU per round trip is
    measured."""
    topic = "commit-topic"
    cpu = {name: cpu_seconds_probe(pid) for name, pid in pids.items()}

    def broker_cpu() -> float:
        return sum(probe() for probe in cpu.values())

    for name, bootstrap in targets.items():
        mock_sized_topic(bootstrap, topic, name == "mock")
        round_trips_per_second(bootstrap, topic, "warm-up", 0.2)

    def target(name: str, call: str):
        probe = cpu.get(name)

        def run(rep: int) -> dict:
            cpu_before = probe() if probe else 0.0
            rate = round_trips_per_second(targets[name], topic, f"{call}-{rep}",
                                          args.commit_seconds, call)
            if probe is None:
                return {"per_s": rate}
            # The broker's CPU per round trip, the consumer's set-up included.
            return {"per_s": rate,
                    "cpu_s": (probe() - cpu_before) / (rate * args.commit_seconds)}
        return run

    result = {}
    for call in ("commit", "fetch"):
        reps = rounds(args, {name: target(name, call) for name in targets}, broker_cpu)
        for rep, row in enumerate(reps):
            _log(call, rep, row, lambda run: f"{run['per_s']:,.0f} round trips/s")
        result[call] = {"runs": reps, **summarize(reps, "per_s", args.max_other_load,
                                                  ("oncelog", "mock")),
                        "cpu_us": {name: median([r[name]["cpu_s"] for r in reps]) * 1e6
                                   for name in pids}}
        result[call]["oncelog_cpu_us"] = result[call]["cpu_us"]["oncelog"]
        if OTHER in targets:
            result[call]["paired_against_src"] = summarize(
                reps, "per_s", args.max_other_load, ("oncelog", OTHER))["paired_ratio"]
    return result


# --- consume: subscribe() against assign() ----------------------------------------------------

def fill(bootstrap: str, topic: str, partitions: int, messages: int) -> None:
    from confluent_kafka import Producer

    create_topic(bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    value = b"v" * 100
    for i in range(messages):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(RUN_TIMEOUT):
        raise RuntimeError("records not delivered")


def consume_run(bootstrap: str, topic: str, partitions: int, messages: int, mode: str,
                group: str) -> dict:
    """Seconds from the call to the first record, and the rate over the last 80% of the
    records: librdkafka fetches ahead into its queue, so the rate from the first record
    would count records fetched while the clock was not running yet."""
    from confluent_kafka import TopicPartition

    consumer = _consumer(bootstrap, group, **{"auto.offset.reset": "earliest", **CONSUME_CONF})
    try:
        seen = 0
        first = steady = None
        mark = messages // 5
        deadline = time.monotonic() + RUN_TIMEOUT
        start = time.perf_counter()
        if mode == "assign":
            # From offset 0 itself: OFFSET_BEGINNING makes librdkafka wait 500 ms before its
            # first ListOffsets (against the mock as well).
            consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        else:
            consumer.subscribe([topic])
        while seen < messages:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: read {seen} of {messages} in {RUN_TIMEOUT} s")
            batch = consumer.consume(1000, 0.5)
            good = sum(1 for m in batch if m.error() is None)
            if good and first is None:
                first = time.perf_counter()
            if steady is None and seen + good > mark:
                steady, at = time.perf_counter(), seen + good
            seen += good
        last = time.perf_counter()
        return {"to_first_s": first - start, "to_last_s": last - start,
                "msgs_per_s": (messages - at) / (last - steady)}
    finally:
        consumer.close()


def run_consume(args, bootstrap: str, ours) -> dict:
    topic, partitions = "consume-topic", 4
    fill(bootstrap, topic, partitions, args.messages)
    consume_run(bootstrap, topic, partitions, args.messages, "subscribe", "warm-up")

    def target(mode: str):
        return lambda rep: consume_run(bootstrap, topic, partitions, args.messages, mode,
                                       f"consume-{mode}-{rep}")

    reps = rounds(args, {mode: target(mode) for mode in ("assign", "subscribe")}, ours)
    for rep, row in enumerate(reps):
        _log("consume", rep, row, lambda run: f"{run['msgs_per_s']:,.0f} msgs/s, first record "
             f"after {run['to_first_s'] * 1000:.0f} ms")
    out = {"runs": reps, **summarize(reps, "msgs_per_s", args.max_other_load,
                                     ("subscribe", "assign"))}
    for key in ("to_first_s", "to_last_s"):
        out[key] = summarize(reps, key, args.max_other_load)["median"]
    return out


# --- memory -----------------------------------------------------------------------------------

def make_groups(bootstrap: str, first: int, count: int, topic: str,
                window: int = 500) -> list[tuple[str, int, str]]:
    """``count`` groups (group-<first>...) of one member each, over the protocol: (group,
    generation, member id) of each."""
    from kio.schema.consumer_protocol_assignment.v0.data import TopicPartition as Assigned
    from kio.schema.errors import ErrorCode

    from oncelog.client.network.connection import connect
    from oncelog.protocol import api_versions as apis
    from oncelog.protocol.consumer_protocol import write_assignment, write_subscription
    from oncelog.protocol.schema import build

    session = datetime.timedelta(milliseconds=1_800_000)  # the largest allowed: no heartbeats
    metadata = write_subscription(0, topics=(topic,), user_data=None)
    assignment = write_assignment(0, assigned_partitions=(Assigned(topic=topic,
                                                                   partitions=(0,)),),
                                  user_data=None)

    def join(group: str, member: str):
        def make(mod, version):
            protocol = build(mod.JoinGroupRequestProtocol, name="range", metadata=metadata)
            return build(mod.JoinGroupRequest, group_id=group, session_timeout=session,
                         rebalance_timeout=session, member_id=member, group_instance_id=None,
                         protocol_type="consumer", protocols=(protocol,), reason=None)
        return make

    def sync(group: str, generation: int, member: str):
        def make(mod, version):
            mine = build(mod.SyncGroupRequestAssignment, member_id=member,
                         assignment=assignment)
            return build(mod.SyncGroupRequest, group_id=group, generation_id=generation,
                         member_id=member, group_instance_id=None, protocol_type="consumer",
                         protocol_name="range", assignments=(mine,))
        return make

    def pipelined(api_key: int, makes: list) -> list:
        for make in makes:
            conn.send_only(api_key, make)
        return [conn.receive()[1] for _ in makes]

    made = []
    with connect(bootstrap, "memory-bench", RUN_TIMEOUT) as conn:
        for start in range(first, first + count, window):
            names = [f"group-{i}" for i in range(start, min(start + window, first + count))]
            asked = pipelined(apis.JOIN_GROUP, [join(g, "") for g in names])
            ids = [r.member_id for r in asked]
            joined = pipelined(apis.JOIN_GROUP, [join(g, m) for g, m in zip(names, ids,
                                                                             strict=True)])
            for r in joined:
                if r.error_code != ErrorCode.none:
                    raise RuntimeError(f"JoinGroup: {r.error_code.name}")
            synced = pipelined(apis.SYNC_GROUP, [sync(g, r.generation_id, r.member_id)
                                                 for g, r in zip(names, joined, strict=True)])
            for r in synced:
                if r.error_code != ErrorCode.none:
                    raise RuntimeError(f"SyncGroup: {r.error_code.name}")
            made += [(g, r.generation_id, r.member_id) for g, r in zip(names, joined,
                                                                       strict=True)]
    return made


def commit_groups(bootstrap: str, members: list[tuple[str, int, str]], topic: str,
                  window: int = 500) -> None:
    """Each member of make_groups' groups commits offset 1 of partition 0, as its member."""
    from kio.schema.errors import ErrorCode

    from oncelog.client.network.connection import connect
    from oncelog.protocol import api_versions as apis
    from oncelog.protocol.schema import build

    def commit(group: str, generation: int, member: str):
        def make(mod, version):
            p = build(mod.OffsetCommitRequestPartition, partition_index=0, committed_offset=1,
                      committed_leader_epoch=-1, committed_metadata="")
            t = build(mod.OffsetCommitRequestTopic, name=topic, partitions=(p,))
            return build(mod.OffsetCommitRequest, group_id=group,
                         generation_id_or_member_epoch=generation, member_id=member,
                         group_instance_id=None, topics=(t,))
        return make

    with connect(bootstrap, "memory-bench", RUN_TIMEOUT) as conn:
        for start in range(0, len(members), window):
            some = members[start:start + window]
            for group, generation, member in some:
                conn.send_only(apis.OFFSET_COMMIT, commit(group, generation, member))
            for _ in some:
                error = conn.receive()[1].topics[0].partitions[0].error_code
                if error != ErrorCode.none:
                    raise RuntimeError(f"OffsetCommit: {error.name}")


def run_memory(args) -> dict:
    topic, warm = "memory-topic", 100
    with OncelogBroker({**NO_DELAY, "metrics.listener": "127.0.0.1:0"}) as broker:
        fill(broker.bootstrap, topic, 1, 10)
        commit_groups(broker.bootstrap, make_groups(broker.bootstrap, 0, warm, topic), topic)
        time.sleep(1.0)  # the background stores of the warm-up groups
        before = hostile_clients.rss(broker.pid)
        started = time.perf_counter()
        members = make_groups(broker.bootstrap, warm, args.groups, topic)
        join_s = time.perf_counter() - started
        joined = hostile_clients.rss(broker.pid)
        commit_groups(broker.bootstrap, members, topic)
        committed = hostile_clients.rss(broker.pid)
        scrape = []
        for _ in range(3):
            started = time.perf_counter()
            with urllib.request.urlopen(broker.metrics_url,
                                        timeout=60) as answer:
                body = answer.read()
            scrape.append(time.perf_counter() - started)
        lag_lines = sum(1 for line in body.splitlines()
                        if line.startswith(b"oncelog_consumer_group_lag{"))
    result = {"groups": args.groups, "rss_before": before, "rss_joined": joined,
              "rss_committed": committed, "join_sync_s": join_s,
              "bytes_per_group_joined": (joined - before) / args.groups,
              "bytes_per_group_committed": (committed - before) / args.groups,
              "metrics_s": min(scrape), "metrics_bytes": len(body), "lag_lines": lag_lines}
    print(f"  memory: {result['bytes_per_group_joined']:,.0f} B/group joined, "
          f"{result['bytes_per_group_committed']:,.0f} B/group with an offset; /metrics "
          f"{result['metrics_s'] * 1000:.0f} ms", file=sys.stderr, flush=True)
    return result


# --- the run ----------------------------------------------------------------------------------

def run(args) -> dict:
    results: dict = {"machine": machine(), "repeats": args.repeats}
    wait_if_asked(args)
    meter = LoadMeter()
    parts = set(args.parts.split(","))
    if args.src:
        results["src"] = str(args.src)
    if "join" in parts:
        with OncelogBroker(NO_DELAY) as fast, OncelogBroker(SHORT_DELAY) as short, \
                OncelogBroker() as default, MockCluster() as mock, \
                _other_broker(args) as other:
            brokers = [fast, short, default] + ([other] if other else [])
            probes = [cpu_seconds_probe(b.pid) for b in brokers]
            results["join"] = run_join(args, {"oncelog": fast.bootstrap,
                                              "oncelog, delay 100 ms": short.bootstrap,
                                              "oncelog, delay 3000 ms": default.bootstrap,
                                              **({OTHER: other.bootstrap} if other else {}),
                                              "mock": mock.bootstrap},
                                       lambda: sum(probe() for probe in probes))
    if "commit" in parts:
        with OncelogBroker(NO_DELAY) as broker, MockCluster() as mock, \
                _other_broker(args) as other:
            ours = {"oncelog": broker, **({OTHER: other} if other else {})}
            if other:
                results["src"] = other.package_dir()  # what ran, as Python found it
            results["commit"] = run_commit(
                args, {**{name: b.bootstrap for name, b in ours.items()},
                       "mock": mock.bootstrap}, {name: b.pid for name, b in ours.items()})
    if "consume" in parts:
        with OncelogBroker(NO_DELAY) as broker:
            results["consume"] = run_consume(args, broker.bootstrap,
                                             cpu_seconds_probe(broker.pid))
    if "memory" in parts:
        results["memory"] = run_memory(args)
    results["other_load"] = meter.others_share()
    return results


def _other_broker(args):
    """The --src checkout's broker (group.initial.rebalance.delay.ms=0), or nothing."""
    if not args.src:
        return contextlib.nullcontext()
    return OncelogBroker(NO_DELAY, src=source_tree(args.src))


def _used(summary: dict, limit: float) -> str:
    if summary["only_quiet"]:
        return f"{summary['used']} of {summary['of']} repetitions (others <= {limit:.0%})"
    return f"all {summary['of']} repetitions, FEWER THAN 3 QUIET: not trustworthy"


def report(results: dict, args) -> None:
    print(f"machine: {results['machine']}")
    print(f"other processes used {results['other_load']:.0%} of the CPUs over the whole run; "
          f"medians over the repetitions in which they used at most {args.max_other_load:.0%}")
    if "join" in results:
        j = results["join"]
        m = j["median"]
        print(f"\n{args.members} consumers join, until all hold a partition; "
              f"{_used(j, args.max_other_load)}")
        print("\n| join | seconds | / mock | paired | target | |")
        print("|---|---:|---:|---:|---:|---|")
        for name, seconds in m.items():
            ratio = seconds / m["mock"]
            goal = (f"{j['paired_ratio']:.3f} | <= {JOIN_GOAL} | "
                    f"{'met' if ratio <= JOIN_GOAL else 'MISSED'}"
                    if name == "oncelog" else " | | ")
            label = "oncelog, delay 0 (the goal's)" if name == "oncelog" else name
            print(f"| {label} | {seconds:.3f} | {ratio:.3f} | {goal} |")
    if "commit" in results:
        print(f"\nsynchronous round trips of one consumer; commit: "
              f"{_used(results['commit']['commit'], args.max_other_load)}, fetch: "
              f"{_used(results['commit']['fetch'], args.max_other_load)}")
        print("\n| round trips | oncelog / s | mock / s | ratio | paired | target | | "
              "oncelog broker CPU per round trip |")
        print("|---|---:|---:|---:|---:|---:|---|---:|")
        for call, what in (("commit", "OffsetCommit (commit)"),
                           ("fetch", "OffsetFetch (committed), for reference")):
            c = results["commit"][call]
            m = c["median"]
            ratio = m["oncelog"] / m["mock"]
            goal = (f">= {COMMIT_GOAL} | {'met' if ratio >= COMMIT_GOAL else 'MISSED'}"
                    if call == "commit" else " | ")
            print(f"| {what} | {m['oncelog']:,.0f} | {m['mock']:,.0f} | {ratio:.2f} | "
                  f"{c['paired_ratio']:.2f} | {goal} | {c['oncelog_cpu_us']:.0f} us |")
        if "src" in results:
            print(f"\nA/B: this tree's broker and the one of --src {results['src']}, same runs")
            print("\n| round trips | this tree / s | --src / s | this / --src | paired | "
                  "broker CPU per round trip, this / --src |")
            print("|---|---:|---:|---:|---:|---:|")
            for call, what in (("commit", "OffsetCommit (commit)"),
                               ("fetch", "OffsetFetch (committed)")):
                c = results["commit"][call]
                m = c["median"]
                print(f"| {what} | {m['oncelog']:,.0f} | {m[OTHER]:,.0f} | "
                      f"{m['oncelog'] / m[OTHER]:.2f} | {c['paired_against_src']:.2f} | "
                      f"{c['cpu_us']['oncelog']:.0f} / {c['cpu_us'][OTHER]:.0f} us |")
    if "consume" in results:
        c = results["consume"]
        m = c["median"]
        ratio = m["subscribe"] / m["assign"]
        print(f"\nconsume {args.messages:,} x 100 B from 4 partitions; "
              f"{_used(c, args.max_other_load)}")
        print("\n| consume | msgs/s (last 80%) | first record after | all after | / assign | "
              "paired | target | |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for mode in ("assign", "subscribe"):
            tail = (f"{ratio:.2f} | {c['paired_ratio']:.2f} | >= {CONSUME_GOAL} | "
                    f"{'met' if ratio >= CONSUME_GOAL else 'MISSED'}"
                    if mode == "subscribe" else " | | | ")
            print(f"| {mode}() | {m[mode]:,.0f} | {c['to_first_s'][mode] * 1000:.0f} ms | "
                  f"{c['to_last_s'][mode]:.2f} s | {tail} |")
    if "memory" in results:
        m = results["memory"]
        print(f"\nmemory: {m['groups']:,} groups of 1 member (broker RSS "
              f"{m['rss_before'] / 2**20:.1f} MiB before): "
              f"{m['bytes_per_group_joined']:,.0f} B per group after JoinGroup + SyncGroup "
              f"({m['join_sync_s']:.1f} s for all), {m['bytes_per_group_committed']:,.0f} B "
              f"per group with one committed offset; /metrics in "
              f"{m['metrics_s'] * 1000:.0f} ms ({m['metrics_bytes']:,} B, "
              f"{m['lag_lines']:,} lag lines)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    add_parts_argument(parser, PARTS)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--commit-seconds", type=float, default=3.0)
    parser.add_argument("--messages", type=int, default=3_000_000)
    parser.add_argument("--groups", type=int, default=10_000)
    add_quiet_arguments(parser)
    parser.add_argument("--src", type=Path, metavar="DIR",
                        help="another checkout's src/ (or its root) whose broker runs beside "
                             "this tree's in the join and commit parts (an A/B)")
    add_json_argument(parser)
    args, _ = parser.parse_known_args(argv)  # other modules' options are not ours
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    results = run(args)
    report(results, args)
    write_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
