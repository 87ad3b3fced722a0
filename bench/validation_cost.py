"""The cost of record validation: produce throughput with it / without it, side by side.

    .venv/bin/python bench/validation_cost.py [--baseline 904648a] [--messages N]
        [--repeats 9] [--batching default|16KiB] [--wait-quiet 600] [--max-other-load 0.10]
        [--data-dir /dev/shm]

Two brokers run at once: this tree's, which validates every produced batch's records
(protocol/validation.py, the walk in _records.c), and one from ``--baseline``, a commit
before validation (``git archive`` of it into a temporary directory, its compiled parts built
there), which checked only the batch frame and its CRC. The same confluent-kafka producer
as bench/produce_consume.py (1 KiB incompressible values, no keys, acks=all, librdkafka's
default batching, so about 1 MB batches of 1,000 records; also 16 KiB batches) writes to
each in turn, the order alternating from one repetition to the next so that drift hits both
alike. Printed per batching: the median throughput of each, the median of the paired ratios
with / without (target for default batching: >= 0.90, the issue's "at most 10%"), and each
broker's CPU per message (its threads' schedstat), which does not depend on the wall clock.

Also printed: validate_batches on one such 1 MB batch in this process (compiled walk, then
the Python twin), the cost with nothing else in the way.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _support import (
    REPO,
    LoadMeter,
    OncelogBroker,
    add_quiet_arguments,
    cpu_seconds_probe,
    median,
    wait_if_asked,
)
from produce_consume import (
    PAYLOAD,
    SCENARIOS,
    _delete_topics,
    produce_throughput,
)

from oncelog.protocol import records
from oncelog.protocol.record_batch import split_batches
from oncelog.protocol.validation import DEFAULT_RULES, validate_batches

BASELINE = "904648a"  # main just before record validation
MESSAGES = {"default": 1_000_000, "16KiB": 200_000}  # about 2 s a run either way
TARGET = 0.90


def baseline_tree(commit: str, into: Path) -> Path:
    """``src/`` of ``commit``, with its compiled parts built in place; returns its path."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src", "setup.py",
                              "pyproject.toml"], capture_output=True, check=True, timeout=60)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True,
                   timeout=60)
    built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                           cwd=into, capture_output=True, text=True, timeout=300)
    if built.returncode != 0:
        print(f"warning: the baseline's compiled parts did not build; it runs without them:\n"
              f"{built.stderr[-2000:]}", file=sys.stderr)
    return into / "src"


def in_process_cost(repeats: int = 200) -> dict[str, float]:
    """Microseconds validate_batches takes on one 1 MB batch of 1,000 1 KiB records."""
    batch = records.encode_batch([(None, PAYLOAD, (), int(time.time() * 1000))] * 1000)
    headers = split_batches(batch, 1 << 30)
    now = int(time.time() * 1000)
    out = {}
    compiled = records.compiled
    for name, impl in (("compiled", compiled), ("python", None)):
        records.compiled = impl
        try:
            times = []
            for _ in range(repeats if impl is not None else max(1, repeats // 20)):
                start = time.perf_counter()
                validate_batches(batch, headers, DEFAULT_RULES, now)
                times.append(time.perf_counter() - start)
        finally:
            records.compiled = compiled
        out[name] = median(times) * 1e6
    start = time.perf_counter()
    for _ in range(repeats):
        split_batches(batch, 1 << 30)
    out["split_batches"] = (time.perf_counter() - start) / repeats * 1e6
    return out


def run(args) -> dict:
    results: dict[str, list[dict]] = {b: [] for b in args.batching}
    with tempfile.TemporaryDirectory(prefix="oncelog-baseline-") as tmp:
        base_src = baseline_tree(args.baseline, Path(tmp))
        with OncelogBroker(base_dir=args.data_dir) as new, \
                OncelogBroker(src=base_src, base_dir=args.data_dir) as old:
            brokers = {"validating": new, "baseline": old}
            for name, broker in brokers.items():
                print(f"{name} broker from {broker.package_dir()}", flush=True)
            probes = {name: cpu_seconds_probe(b.pid) for name, b in brokers.items()}
            for batching in args.batching:
                count = args.messages or MESSAGES[batching]
                extra = SCENARIOS[batching]
                for broker in brokers.values():  # untimed: the first run is slower
                    produce_throughput(broker.bootstrap, f"warm-{batching}",
                                       max(1000, count // 10), extra)
                    _delete_topics(broker.bootstrap, [f"warm-{batching}"])
                for rep in range(args.repeats):
                    order = list(brokers) if rep % 2 == 0 else list(reversed(brokers))
                    pair = {}
                    for name in order:
                        broker, probe = brokers[name], probes[name]
                        topic = f"v-{batching}-{rep}"
                        meter = LoadMeter(probe)
                        cpu = probe()
                        result = produce_throughput(broker.bootstrap, topic, count, extra)
                        pair[name] = {"msgs_per_s": result.msgs_per_s,
                                      "cpu_us_per_msg": (probe() - cpu) / count * 1e6,
                                      "others": meter.others_share()}
                        _delete_topics(broker.bootstrap, [topic])
                    results[batching].append(pair)
                    print(f"  {batching:8s} #{rep + 1}: " + "  ".join(
                        f"{n} {p['msgs_per_s']:>9,.0f} msgs/s ({p['cpu_us_per_msg']:.2f} us "
                        f"broker CPU/msg)" for n, p in pair.items())
                        + f"; others <= {max(p['others'] for p in pair.values()):.0%}",
                        flush=True)
    return results


def summary(reps: list[dict], max_other_load: float) -> dict:
    quiet = [p for p in reps if max(r["others"] for r in p.values()) <= max_other_load]
    used = quiet if len(quiet) >= 3 else reps
    out = {"used": len(used), "of": len(reps), "only_quiet": used is quiet,
           "ratio": median([p["validating"]["msgs_per_s"] / p["baseline"]["msgs_per_s"]
                            for p in used]),
           "cpu_ratio": median([p["baseline"]["cpu_us_per_msg"]
                                / p["validating"]["cpu_us_per_msg"] for p in used])}
    for name in ("validating", "baseline"):
        out[name] = median([p[name]["msgs_per_s"] for p in used])
        out[f"{name} cpu"] = median([p[name]["cpu_us_per_msg"] for p in used])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE,
                        help="the commit to compare with (default %(default)s)")
    parser.add_argument("--messages", type=int, help="messages per run (default: "
                        + ", ".join(f"{k} {v:,}" for k, v in MESSAGES.items()) + ")")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--batching", action="append", choices=list(SCENARIOS),
                        help="run only this batching (repeatable; default: all)")
    add_quiet_arguments(parser)
    parser.add_argument("--data-dir", type=Path,
                        help="where the brokers' temporary log.dirs are made")
    args, _ = parser.parse_known_args(argv)
    args.batching = args.batching or list(SCENARIOS)
    wait_if_asked(args)
    cost = in_process_cost()
    print(f"validate_batches on one 1 MB batch of 1,000 1 KiB records: "
          f"{cost['compiled']:.1f} us compiled, {cost['python']:.0f} us with the Python twin "
          f"(split_batches, which the baseline did too: {cost['split_batches']:.1f} us)",
          flush=True)
    results = run(args)
    print(f"validation_cost: confluent-kafka producer, 1 KiB values, acks=all, "
          f"{args.repeats} repetitions, baseline {args.baseline}; medians over those during "
          f"which other processes used <= {args.max_other_load:.0%} of the CPUs (all when "
          f"fewer than 3)")
    for batching in args.batching:
        s = summary(results[batching], args.max_other_load)
        used = f"{s['used']} of {s['of']}" + ("" if s["only_quiet"] else ", NOT quiet")
        verdict = ("ok" if s["ratio"] >= TARGET else "MISS") if batching == "default" else "-"
        print(f"  {batching:8s} ({used} repetitions) msgs/s validating {s['validating']:,.0f}, "
              f"baseline {s['baseline']:,.0f}; validating / baseline = {s['ratio']:.3f} "
              f"(target >= {TARGET}: {verdict}); broker CPU per message "
              f"{s['validating cpu']:.2f} / {s['baseline cpu']:.2f} us "
              f"(baseline / validating = {s['cpu_ratio']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
