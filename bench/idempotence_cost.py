"""The cost of idempotence: idempotent / plain produce throughput on one broker, one run.

    .venv/bin/python bench/idempotence_cost.py [--messages N] [--repeats 9] [--wait-quiet 600]
        [--max-other-load 0.10] [--data-dir /dev/shm] [--client-stats] [--src DIR] [--no-mock]
        [--batching default|16KiB]

confluent-kafka, 1 KiB values, acks=all, one partition, the same oncelog broker for every
mode; the modes rotate within each repetition so drift hits them alike, and each repetition
gives ratios. Printed: median ratios for librdkafka's default batching (1,000,000 messages a
run) and 16 KiB batches (200,000 a run). Target (issue 3): >= 0.97 (Kafka's published cost
of idempotence is about 3%).

Two baselines, because librdkafka's idempotent producer keeps only one produce request in
flight whatever max.in.flight says (confluentinc/librdkafka#4989, open):

* plain@1, a plain producer held to max.in.flight=1: the same pipelining, so idempotent /
  plain@1 is the broker's cost of idempotence (the sequence checks and the producer state);
* plain with librdkafka's defaults (up to 1,000,000 in flight): idempotent / plain is what a
  librdkafka user sees, mostly the client's one-in-flight pacing.

The same is run against librdkafka's mock cluster in the same run: its idempotent / plain is
the client's part alone, which no broker can remove.

Noise: on a 2-CPU machine the client (Python's produce loop and librdkafka's threads, more
than one CPU at default batching) and the broker share the CPUs with whatever else runs, and
a run during which another process takes a CPU is far slower. So for every run the CPU other
processes used is measured, and repetitions during which they used more than
``--max-other-load`` of the CPUs are left out of the medians (when at least 3 remain). Two
measures do not depend on the wall clock: the broker's CPU time per message (its threads'
schedstat), whose ratio plain@1 / idempotent is the broker's cost of idempotence as the
broker would see it were it the bottleneck, and the number of batches each run stored (one
per produce request), which shows whether the modes sent the same requests. The client's CPU
per message (this process: Python's produce loop and librdkafka's threads) is printed too:
where the client needs more than a CPU, its own cost of idempotence takes CPU from the broker.
With ``--client-stats``, librdkafka's statistics give its broker thread's wake-ups per message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _support import (
    LoadMeter,
    MockCluster,
    OncelogBroker,
    add_quiet_arguments,
    cpu_seconds_probe,
    median,
    wait_if_asked,
)
from produce_consume import (
    PAYLOAD,
    RUN_TIMEOUT,
    SCENARIOS,
    Throughput,
    _check_delivered,
    _delete_topics,
    produce_throughput,
)

from oncelog.protocol.record_batch import HEADER_SIZE, read_header

MODES = {"plain": {"enable.idempotence": False},
         "plain@1": {"enable.idempotence": False, "max.in.flight": 1},
         "idempotent": {"enable.idempotence": True}}
MESSAGES = {"default": 1_000_000, "16KiB": 200_000}  # about 2 s a run either way


@dataclass
class Run:
    msgs_per_s: float
    others: float  # share of all CPUs other processes used meanwhile
    client_us_per_msg: float = float("nan")  # this process: Python's loop and librdkafka
    wakeups_per_msg: float = float("nan")  # librdkafka's broker thread; with --client-stats
    rtt_ms: float = float("nan")  # librdkafka's mean produce round trip; with --client-stats
    broker_us_per_msg: float = float("nan")  # oncelog only
    batches: int = 0  # batches the partition stored (= produce requests); oncelog only


def _own_cpu_seconds() -> float:
    """CPU this process used so far, all threads (librdkafka's too, even ended ones)."""
    t = os.times()
    return t.user + t.system


# oncelog.Producer's config for each mode and batching (--client oncelog): the same modes,
# and librdkafka's batching (1 MB batches at default batching, linger.ms=5 for both). Unlike
# librdkafka's idempotent producer it keeps up to 5 requests in flight with idempotence, so
# for it idempotent / plain (both 5 in flight) is the like-for-like ratio.
ONCELOG_MODES = {"plain": {"enable.idempotence": "false"},
                 "plain@1": {"enable.idempotence": "false",
                             "max.in.flight.requests.per.connection": 1},
                 "idempotent": {"enable.idempotence": "true"}}
ONCELOG_BATCHING = {"default": {"batch.size": 1_000_000, "linger.ms": 5},
                    "16KiB": {"batch.size": 16384, "linger.ms": 5}}


def produce_throughput_oncelog(bootstrap: str, topic: str, n: int, mode: str,
                               batching: str) -> Throughput:
    """As produce_consume.produce_throughput, with oncelog.Producer."""
    import oncelog

    producer = oncelog.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                 "buffer.memory": 64 * 1024 * 1024,
                                 "delivery.timeout.ms": RUN_TIMEOUT * 1000,
                                 **ONCELOG_MODES[mode], **ONCELOG_BATCHING[batching]})
    try:
        producer.produce(topic, PAYLOAD, partition=0)  # untimed: topic, connection, id
        producer.flush(RUN_TIMEOUT)
        produce = producer.produce
        start = time.perf_counter()
        for _ in range(n):
            produce(topic, PAYLOAD, partition=0)
        producer.flush(RUN_TIMEOUT)
        seconds = time.perf_counter() - start
    finally:
        producer.close(RUN_TIMEOUT)
    _check_delivered(bootstrap, topic, n + 1)
    return Throughput(n, seconds)


def stored_batches(partition_dir: Path) -> int:
    """Batches in a partition's segment files, read header by header."""
    count = 0
    for path in sorted(partition_dir.glob("*.log")):
        with open(path, "rb") as f:
            while len(header := f.read(HEADER_SIZE)) == HEADER_SIZE:
                count += 1
                f.seek(read_header(header).size - HEADER_SIZE, 1)
    return count


class ClientStats:
    """librdkafka's statistics (``statistics.interval.ms``): the broker thread's wake-ups
    (``brokers[].wakeups``, cumulative; the last report is at most one interval old) and the
    produce round trip (``brokers[].rtt``, a window reset at every report, so the windows'
    sums and counts add up over the run)."""

    INTERVAL_MS = 100

    def __init__(self) -> None:
        self.last = ""
        self.rtt_sum_us = 0
        self.rtt_count = 0

    def conf(self) -> dict:
        return {"statistics.interval.ms": self.INTERVAL_MS, "stats_cb": self._keep}

    def _keep(self, report: str) -> None:
        self.last = report
        for broker in self._brokers(report):
            self.rtt_sum_us += broker["rtt"]["sum"]
            self.rtt_count += broker["rtt"]["cnt"]

    @staticmethod
    def _brokers(report: str) -> list[dict]:
        brokers = json.loads(report)["brokers"].values() if report else []
        return [b for b in brokers if b["nodeid"] >= 0]

    def wakeups(self) -> int:
        return sum(b["wakeups"] for b in self._brokers(self.last))

    def rtt_ms(self) -> float:
        """Mean time from a request's send to its answer, over the run."""
        return self.rtt_sum_us / self.rtt_count / 1000 if self.rtt_count else float("nan")


def run_pairs(bootstrap: str, name: str, messages: dict[str, int], repeats: int,
              broker: OncelogBroker | None = None,
              client_stats: bool = False,
              batchings: list[str] | None = None,
              producer_client: str = "confluent") -> dict[str, list[dict[str, Run]]]:
    """Every repetition of every scenario: {scenario: [{mode: Run}]}."""
    probe = cpu_seconds_probe(broker.pid) if broker else None
    results: dict[str, list[dict[str, Run]]] = {}
    for batching in batchings or list(SCENARIOS):
        extra = SCENARIOS[batching]
        count = messages[batching]
        warm_up = f"cost-{batching}-warm-up"  # untimed: the first run after start is slower
        if producer_client == "oncelog":
            produce_throughput_oncelog(bootstrap, warm_up, max(1000, count // 10),
                                       "idempotent", batching)
        else:
            produce_throughput(bootstrap, warm_up, max(1000, count // 10), extra)
        if broker:
            _delete_topics(bootstrap, [warm_up])
        results[batching] = []
        for rep in range(repeats):
            modes = list(MODES)
            order = modes[rep % len(modes):] + modes[:rep % len(modes)]
            pair: dict[str, Run] = {}
            for mode in order:
                topic = f"cost-{batching}-{mode.replace('@', '-at-')}-{rep}"
                meter = LoadMeter(probe)
                cpu = probe() if probe else 0.0
                client = _own_cpu_seconds()
                stats = ClientStats()
                if producer_client == "oncelog":
                    result = produce_throughput_oncelog(bootstrap, topic, count, mode, batching)
                else:
                    result = produce_throughput(bootstrap, topic, count,
                                                {**extra, **MODES[mode],
                                                 **(stats.conf() if client_stats else {})})
                run = Run(result.messages / result.seconds, meter.others_share(),
                          (_own_cpu_seconds() - client) / result.messages * 1e6)
                if client_stats:
                    run.wakeups_per_msg = stats.wakeups() / result.messages
                    run.rtt_ms = stats.rtt_ms()
                if broker and probe:
                    run.broker_us_per_msg = (probe() - cpu) / result.messages * 1e6
                    run.batches = stored_batches(broker.data_dir / f"{topic}-0")
                    # Dirty pages piling up from run to run would slow the later runs.
                    _delete_topics(bootstrap, [topic])
                pair[mode] = run
            results[batching].append(pair)
            line = "  ".join(f"{mode} {pair[mode].msgs_per_s:>9,.0f}" for mode in MODES)
            line += "  client us/msg " + " ".join(
                f"{pair[mode].client_us_per_msg:.2f}" for mode in MODES)
            if client_stats:
                line += "  wakeups/msg " + " ".join(
                    f"{pair[mode].wakeups_per_msg:.2f}" for mode in MODES)
                line += "  rtt ms " + " ".join(f"{pair[mode].rtt_ms:.2f}" for mode in MODES)
            if broker:
                line += "  broker " + " ".join(
                    f"{pair[mode].broker_us_per_msg:.2f}" for mode in MODES)
                line += "  batches " + " ".join(str(pair[mode].batches) for mode in MODES)
            others = max(run.others for run in pair.values())
            print(f"  {name:8s} {batching:8s} #{rep + 1}: {line} msgs/s; others <= {others:.0%}",
                  flush=True)
    return results


def summary(reps: list[dict[str, Run]], max_other_load: float) -> dict:
    """Medians over the repetitions during which other processes stayed under
    ``max_other_load`` of the CPUs when there are at least 3, else over all."""
    quiet = [pair for pair in reps if max(r.others for r in pair.values()) <= max_other_load]
    used = quiet if len(quiet) >= 3 else reps
    out: dict = {"used": len(used), "of": len(reps), "only_quiet": used is quiet,
                 "fair": median([p["idempotent"].msgs_per_s / p["plain@1"].msgs_per_s
                                 for p in used]),
                 "ratio": median([p["idempotent"].msgs_per_s / p["plain"].msgs_per_s
                                  for p in used]),
                 "cpu": median([p["plain@1"].broker_us_per_msg / p["idempotent"].broker_us_per_msg
                                for p in used])}
    for mode in MODES:
        out[mode] = median([p[mode].msgs_per_s for p in used])
        out[f"{mode} client"] = median([p[mode].client_us_per_msg for p in used])
        out[f"{mode} wakeups"] = median([p[mode].wakeups_per_msg for p in used])
        out[f"{mode} rtt"] = median([p[mode].rtt_ms for p in used])
        out[f"{mode} us/msg"] = median([p[mode].broker_us_per_msg for p in used])
        out[f"{mode} batches"] = median([p[mode].batches for p in used])
    return out


def run(messages: dict[str, int], repeats: int, data_dir: Path | None, client_stats: bool,
        src: Path | None = None, mock: bool = True,
        batchings: list[str] | None = None,
        producer_client: str = "confluent") -> dict[str, dict]:
    with OncelogBroker(src=src, base_dir=data_dir) as broker:
        print(f"oncelog broker from {broker.package_dir()}", flush=True)
        oncelog = run_pairs(broker.bootstrap, "oncelog", messages, repeats, broker, client_stats,
                            batchings, producer_client)
    if not mock:
        return {"oncelog": oncelog, "mock": oncelog}
    with MockCluster() as cluster:
        mocked = run_pairs(cluster.bootstrap, "mock", messages, repeats, None, client_stats,
                           batchings, producer_client)
    return {"oncelog": oncelog, "mock": mocked}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int,
                        help="messages per run for both batchings (default: "
                             + ", ".join(f"{k} {v:,}" for k, v in MESSAGES.items()) + ")")
    parser.add_argument("--repeats", type=int, default=9)
    add_quiet_arguments(parser)
    parser.add_argument("--data-dir", type=Path,
                        help="where the broker's temporary log.dirs is made (default: the "
                             "system temp dir); e.g. /dev/shm to take the disk out")
    parser.add_argument("--client-stats", action="store_true",
                        help="also collect librdkafka's statistics every "
                             f"{ClientStats.INTERVAL_MS} ms and print its broker thread's "
                             "wake-ups per message")
    parser.add_argument("--src", type=Path,
                        help="run the broker from this source tree (default: the repo's src/), "
                             "e.g. a git archive of another commit for an A/B comparison")
    parser.add_argument("--no-mock", dest="mock", action="store_false",
                        help="skip the runs against librdkafka's mock cluster (the 'on the "
                             "mock' figures then repeat oncelog's)")
    parser.add_argument("--batching", action="append", choices=list(SCENARIOS),
                        help="run only this batching (repeatable; default: all)")
    parser.add_argument("--producer-client", choices=("confluent", "oncelog"),
                        default="confluent",
                        help="the producer: confluent-kafka (default) or oncelog.Producer, "
                             "which keeps 5 requests in flight with idempotence too, so its "
                             "idempotent / plain is like for like")
    args, _ = parser.parse_known_args(argv)
    if args.producer_client == "oncelog" and args.client_stats:
        parser.error("--client-stats reads librdkafka's statistics: confluent-kafka only")
    messages = {k: args.messages or v for k, v in MESSAGES.items()}
    wait_if_asked(args)
    batchings = args.batching or list(SCENARIOS)
    results = run(messages, args.repeats, args.data_dir, args.client_stats, args.src, args.mock,
                  batchings, args.producer_client)
    print(f"idempotence_cost: {args.producer_client} producer, 1 KiB messages, acks=all, "
          f"{args.repeats} repetitions; medians "
          f"over those during which other processes used <= {args.max_other_load:.0%} of the "
          f"CPUs (all when fewer than 3)")
    client_stats = args.client_stats
    for batching in batchings:
        ours = summary(results["oncelog"][batching], args.max_other_load)
        mock = summary(results["mock"][batching], args.max_other_load)
        verdict = "ok" if ours["fair"] >= 0.97 else "MISS"
        used = f"{ours['used']} of {ours['of']}" + ("" if ours["only_quiet"] else ", NOT quiet")
        print(f"  {batching:8s} ({messages[batching]:,} messages a run, {used} repetitions) "
              f"oncelog msgs/s: plain {ours['plain']:,.0f}, plain@1 {ours['plain@1']:,.0f}, "
              f"idempotent {ours['idempotent']:,.0f}; batches stored: "
              + ", ".join(f"{mode} {ours[f'{mode} batches']:.0f}" for mode in MODES))
        print(f"  {batching:8s} idempotent / plain@1 (the broker's cost) = {ours['fair']:.3f} "
              f"(target >= 0.97: {verdict}); broker CPU per message plain@1 / idempotent = "
              f"{ours['cpu']:.3f} ({ours['plain@1 us/msg']:.2f} / "
              f"{ours['idempotent us/msg']:.2f} us); idempotent / plain (what a user of this "
              f"client sees) = {ours['ratio']:.3f}, on the mock {mock['ratio']:.3f}")
        if args.producer_client == "oncelog":
            print(f"  {batching:8s} oncelog.Producer, both 5 in flight: idempotent / plain = "
                  f"{ours['ratio']:.3f} (target >= 0.97: "
                  f"{'ok' if ours['ratio'] >= 0.97 else 'MISS'}); on the mock "
                  f"{mock['ratio']:.3f}")
        print(f"  {batching:8s} client CPU per message (this process, all threads): "
              + ", ".join(f"{mode} {ours[f'{mode} client']:.2f} us" for mode in MODES)
              + ("; librdkafka wake-ups per message: " + ", ".join(
                  f"{mode} {ours[f'{mode} wakeups']:.2f}" for mode in MODES)
                 + "; mean produce rtt: " + ", ".join(
                  f"{mode} {ours[f'{mode} rtt']:.2f} ms" for mode in MODES)
                 + f" (mock: {mock['idempotent rtt']:.2f} ms idempotent)"
                 if client_stats else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
