"""Backpressure: the broker's memory under hostile clients, and what it costs the fast path.

    .venv/bin/python bench/backpressure.py [--src DIR] [--baseline-src DIR] [--repeats 7]
        [--scale 1.0] [--max-other-load 0.10] [--wait-quiet S]
        [--parts hoard,queued-flood,full-flood,slow-senders,fast-path,overhead]

Each attack runs on a fresh broker with default settings (``queued.max.requests=500``,
``queued.max.request.bytes=209715200``, ``socket.request.max.bytes=104857600``); the hostile
clients are tests/support/hostile_clients.py's:

* hoard: 4 connections each pipeline 50 Fetch requests (max_bytes 50 MB) for a partition
  of about 4 MB and read nothing: 800 MB of answers asked for;
* queued-flood: 4 connections each send a Fetch that waits for data, then 900 KB Produce
  requests as fast as the socket takes them: they queue behind the Fetch;
* full-flood: 4 connections write 900 KB Produce requests (to a topic that does not exist,
  so nothing reaches the disk) as fast as the socket takes them and read the answers, 5 s;
* slow-senders: 6 connections each announce a Produce request of 100 MB (the largest
  allowed) and send 1 KiB of it.

For each: the broker's RSS before the attack (after its topics were filled), its peak RSS
during it (VmHWM, reset before the attack), their ratio, and the time a well-behaved
confluent-kafka client takes to produce 2000 records and read them back during the attack
(the least of 3), as a ratio to the same without an attack. An attack is measured once the
broker's CPU time stops growing (it did all the attack let it do), or after 5 s for
full-flood; so a broker without backpressure (``--src`` pointing at an older tree) is
measured the same way.

fast-path (with ``--baseline-src DIR``): produce throughput with confluent-kafka (1 KiB
values, acks=all, librdkafka's default batching and 16 KiB batches) and consume throughput
(bench/produce_consume.py's consume run: 4000 messages read over and over) against a broker
from ``--src`` and one from ``--baseline-src``, each started afresh in each repetition and
measured alone, in alternating order; medians of ``--repeats`` and of the per-repetition
ratios, for messages per second and for the broker's CPU time per message (its threads'
schedstat, which depends less than the wall clock on what else runs on the machine).

overhead (with ``--baseline-src DIR``): bench/_connection_overhead.py under each tree, 5
times alternately: the CPU a request frame costs in Connection and FrameReader alone (the
request handler replaced by a fixed answer), in process, so without the noise of a client
and a machine shared with other work.

Without ``--baseline-src``, fast-path and overhead are skipped.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _support import (
    REPO,
    LoadMeter,
    OncelogBroker,
    add_quiet_arguments,
    cpu_seconds_probe,
    machine,
    wait_if_asked,
)
from produce_consume import (
    CONSUME_PASS,
    SCENARIOS,
    consume_throughput,
    fill_topic,
    produce_throughput,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support import hostile_clients as hostile  # shared with the tests

MiB = 1 << 20
ATTACKERS = 4
SETTLE_TIMEOUT = 120.0
FULL_FLOOD_SECONDS = 5.0
ATTACKS = ("hoard", "queued-flood", "full-flood", "slow-senders")
# Messages per fast-path run: about a second each on a quiet machine (shorter runs made the
# broker's CPU per message vary by a quarter from run to run).
FAST_PATH_MESSAGES = {"default": 1_000_000, "16KiB": 300_000, "consume": 1_000_000}


def create_topics(bootstrap: str, *topics: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        future.result(30)


def settle(pid: int) -> None:
    """Wait until the broker's CPU time stops growing: it did all the attack let it do."""
    probe = cpu_seconds_probe(pid)
    deadline = time.monotonic() + SETTLE_TIMEOUT
    last = probe()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = probe()
        if now - last < 0.02:
            return
        last = now
    print("warning: the broker was still busy after the settle timeout", file=sys.stderr)


def timed_round_trip(bootstrap: str, times: int = 3) -> float:
    """Seconds a well-behaved client takes to produce 2000 records and read them: the least
    of ``times`` (a client's own stalls, such as a second-long pause now and then when
    librdkafka starts or stops, only ever add)."""
    seconds = []
    for _ in range(times):
        start = time.perf_counter()
        hostile.normal_round_trip(bootstrap, "normal", 2000)
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def attack(name: str, broker: OncelogBroker) -> dict:
    port, pid = broker.port, broker.pid
    create_topics(broker.bootstrap, "normal", "hoard", "wake")
    if name == "hoard":
        hostile.fill(broker.bootstrap, "hoard", 4000)
    hostile.normal_round_trip(broker.bootstrap, "normal", 2000)  # warm-up: connections, metadata
    quiet = timed_round_trip(broker.bootstrap)
    gc.collect()
    baseline = hostile.rss(pid)
    hostile.reset_peak_rss(pid)
    closers = []
    round_trip = None
    try:
        if name == "hoard":
            socks = [hostile.hoard_fetches(port, "hoard", 50, 50_000_000)
                     for _ in range(ATTACKERS)]
            closers += [s.close for s in socks]
            settle(pid)
            round_trip = timed_round_trip(broker.bootstrap)
        elif name in ("queued-flood", "full-flood"):
            frame = hostile.produce_frame("no-such-topic", 900_000)
            head = b""
            if name == "queued-flood":
                head = hostile.fetch_frame("wake", MiB, 0, max_wait_ms=600_000)
            flood = hostile.ProduceFlood(port, frame, connections=ATTACKERS, head=head)
            closers.append(flood.close)
            flood.__enter__()
            if name == "queued-flood":
                settle(pid)
            else:
                time.sleep(1.0)  # under way
            round_trip = timed_round_trip(broker.bootstrap)
            if name == "full-flood":
                time.sleep(max(0.0, FULL_FLOOD_SECONDS - 1.0 - round_trip))
                print(f"    flood: {flood.sent} requests written", flush=True)
        else:
            socks = [hostile.announce_frames(port, 104_857_600) for _ in range(6)]
            closers += [s.close for s in socks]
            settle(pid)  # no round trip: see docs/benchmarks.md (the budget is spent)
        now, peak = hostile.rss(pid), hostile.peak_rss(pid)
    finally:
        for close in closers:
            close()
    return {"baseline": baseline, "rss": now, "peak": peak,
            "round_trip": round_trip, "quiet_round_trip": quiet}


def run_attacks(args) -> dict:
    results = {}
    for name in args.parts:
        if name not in ATTACKS:
            continue
        with OncelogBroker(src=args.src) as broker:
            results[name] = attack(name, broker)
        r = results[name]
        trip = ("-" if r["round_trip"] is None
                else f"{r['round_trip']:.2f} s / {r['quiet_round_trip']:.2f} s quiet")
        print(f"  {name:13} RSS before {r['baseline'] / MiB:7.1f} MiB, peak "
              f"{r['peak'] / MiB:7.1f} MiB: ratio {r['peak'] / r['baseline']:5.2f}; "
              f"normal client {trip}", flush=True)
    return results


def run_fast_path(args) -> dict:
    """In each repetition each tree's broker is started afresh and measured alone, in
    alternating order (an A/A run, the same tree twice, with both brokers started once and
    kept running showed the first-started one some 5% cheaper per message). A repetition
    during which other processes used more than --max-other-load of the CPUs (in either
    tree's runs) is left out of the medians, when at least 3 quiet ones remain."""
    sources = {"this": args.src, "baseline": args.baseline_src}
    runs = [*SCENARIOS.items(), ("consume", None)]
    reps: dict[str, list[dict]] = {name: [] for name, _ in runs}
    for rep in range(args.repeats):
        order = list(sources) if rep % 2 == 0 else list(sources)[::-1]
        rows: dict[str, dict] = {scenario: {"others": 0.0} for scenario, _ in runs}
        for label in order:
            with OncelogBroker(src=sources[label]) as broker:
                fill_topic(broker.bootstrap, "fast-consume", CONSUME_PASS)
                for scenario, extra in runs:
                    probe = cpu_seconds_probe(broker.pid)
                    meter = LoadMeter(probe)
                    n = round(FAST_PATH_MESSAGES[scenario] * args.scale)
                    if extra is None:
                        result = consume_throughput(broker.bootstrap, "fast-consume",
                                                    CONSUME_PASS, n, probe)
                    else:
                        result = produce_throughput(broker.bootstrap, f"fast-{scenario}", n,
                                                    extra, probe)
                    row = rows[scenario]
                    row["others"] = max(row["others"], meter.others_share())
                    row[label] = (result.msgs_per_s, result.broker_cpu / result.messages * 1e6)
        for scenario, row in rows.items():
            reps[scenario].append(row)
            print(f"  fast-path {scenario:7} #{rep + 1}: this {row['this'][0]:10,.0f} "
                  f"msgs/s {row['this'][1]:5.2f} µs/msg, baseline "
                  f"{row['baseline'][0]:10,.0f} msgs/s {row['baseline'][1]:5.2f} µs/msg "
                  f"(others {row['others']:.0%})", flush=True)
    results = {}
    for scenario, rows in reps.items():
        quiet = [r for r in rows if r["others"] <= args.max_other_load]
        used = quiet if len(quiet) >= 3 else rows

        def med(label: str, i: int, rows=used) -> float:
            return statistics.median(r[label][i] for r in rows)

        results[scenario] = {
            "this": med("this", 0), "baseline": med("baseline", 0),
            "paired": statistics.median(r["this"][0] / r["baseline"][0] for r in used),
            "cpu_this": med("this", 1), "cpu_baseline": med("baseline", 1),
            "cpu_paired": statistics.median(r["this"][1] / r["baseline"][1] for r in used),
            "used": f"{len(used)} of {len(rows)}" + ("" if used is quiet else " (busy)")}
    return results


def run_overhead(args) -> dict:
    """bench/_connection_overhead.py for each tree, alternately, 5 times; the least of each."""
    script = Path(__file__).resolve().parent / "_connection_overhead.py"
    found: dict[str, dict[str, float]] = {"this": {}, "baseline": {}}
    for rep in range(5):
        labels = ["this", "baseline"] if rep % 2 == 0 else ["baseline", "this"]
        for label in labels:
            src = Path((args.src if label == "this" else args.baseline_src) or REPO / "src")
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in (str(src.resolve()), os.environ.get("PYTHONPATH")) if p)}
            out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                                 text=True, timeout=600, check=True)
            for size, us in json.loads(out.stdout).items():
                found[label][size] = min(us, found[label].get(size, float("inf")))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=None,
                        help="the broker's source tree (default: this repo's src/)")
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="a second source tree for fast-path (e.g. main's, from git archive)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fast-path: scale the messages per run (1,000,000 at default "
                             "batching, 300,000 at 16 KiB, 1,000,000 consumed)")
    parser.add_argument("--parts", default=",".join((*ATTACKS, "fast-path", "overhead")),
                        type=lambda s: s.split(","), help="comma-separated, default: all")
    add_quiet_arguments(parser)
    args, _ = parser.parse_known_args(argv)
    print(f"machine: {machine()}", flush=True)
    if (others := wait_if_asked(args)) is not None:
        print(f"other processes: {others:.0%} of the CPUs")
    attacks = run_attacks(args)
    if attacks:
        print("\n| attack | RSS before (MiB) | peak RSS (MiB) | peak / before | "
              "normal client, attack / quiet |")
        print("|---|---:|---:|---:|---:|")
        for name, r in attacks.items():
            trip = ("-" if r["round_trip"] is None
                    else f"{r['round_trip'] / r['quiet_round_trip']:.2f}")
            print(f"| {name} | {r['baseline'] / MiB:.1f} | {r['peak'] / MiB:.1f} | "
                  f"{r['peak'] / r['baseline']:.2f} | {trip} |")
    if "fast-path" in args.parts:
        if args.baseline_src is None:
            print("\nfast-path skipped: give --baseline-src DIR to compare with another tree")
        else:
            fast = run_fast_path(args)
            print("\n| run | this (msgs/s) | baseline (msgs/s) | ratio (paired) | "
                  "broker CPU this / baseline (µs/msg) | ratio (paired) | repetitions |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for scenario, r in fast.items():
                print(f"| {scenario} | {r['this']:,.0f} | {r['baseline']:,.0f} | "
                      f"{r['this'] / r['baseline']:.3f} ({r['paired']:.3f}) | "
                      f"{r['cpu_this']:.2f} / {r['cpu_baseline']:.2f} | "
                      f"{r['cpu_this'] / r['cpu_baseline']:.3f} ({r['cpu_paired']:.3f}) | "
                      f"{r['used']} |")
    if "overhead" in args.parts and args.baseline_src is not None:
        found = run_overhead(args)
        print("\n| frames of | this (µs/frame) | baseline (µs/frame) | difference |")
        print("|---|---:|---:|---:|")
        for size, us in found["this"].items():
            base = found["baseline"][size]
            print(f"| {size} | {us:.2f} | {base:.2f} | {us - base:+.2f} µs |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
