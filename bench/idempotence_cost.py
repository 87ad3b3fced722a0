"""The cost of idempotence: idempotent / plain produce throughput on one broker, one run.

    .venv/bin/python bench/idempotence_cost.py [--messages 200000] [--repeats 7]

confluent-kafka, 1 KiB values, acks=all, one partition, the same oncelog broker for every
mode; the modes rotate within each repetition so drift hits them alike, and each repetition
gives ratios. Printed: median ratios for librdkafka's default batching and 16 KiB batches.
Target (issue 3): >= 0.97 (Kafka's published cost of idempotence is about 3%).

Two baselines, because librdkafka's idempotent producer keeps only one produce request in
flight whatever max.in.flight says (confluentinc/librdkafka#4989, open):

* plain@1, a plain producer held to max.in.flight=1: the same pipelining, so idempotent /
  plain@1 is the broker's cost of idempotence (the sequence checks and the producer state);
* plain with librdkafka's defaults (up to 1,000,000 in flight): idempotent / plain is what a
  librdkafka user sees, mostly the client's one-in-flight pacing.

The same is run against librdkafka's mock cluster in the same run: its idempotent / plain is
the client's part alone, which no broker can remove.
"""

from __future__ import annotations

import argparse
import sys

from _support import MockCluster, OncelogBroker, median
from produce_consume import SCENARIOS, _delete_topics, produce_throughput

MODES = {"plain": {"enable.idempotence": False},
         "plain@1": {"enable.idempotence": False, "max.in.flight": 1},
         "idempotent": {"enable.idempotence": True}}


def run_pairs(bootstrap: str, name: str, messages: int, repeats: int) -> dict:
    results: dict[str, dict[str, float]] = {}
    for batching, extra in SCENARIOS.items():
        ratios, fair, rates = [], [], {mode: [] for mode in MODES}
        for rep in range(repeats):
            modes = list(MODES)
            order = modes[rep % len(modes):] + modes[:rep % len(modes)]
            pair = {}
            for mode in order:
                topic = f"cost-{batching}-{mode.replace('@', '-at-')}-{rep}"
                result = produce_throughput(bootstrap, topic, messages, {**extra, **MODES[mode]})
                pair[mode] = result.messages / result.seconds
                rates[mode].append(pair[mode])
                if name == "oncelog":
                    # Dirty pages piling up from run to run would slow the later runs.
                    _delete_topics(bootstrap, [topic])
            ratios.append(pair["idempotent"] / pair["plain"])
            fair.append(pair["idempotent"] / pair["plain@1"])
            print(f"  {name:8s} {batching:8s} #{rep + 1}: plain {pair['plain']:>10,.0f}  "
                  f"plain@1 {pair['plain@1']:>10,.0f}  idempotent {pair['idempotent']:>10,.0f} "
                  f"msgs/s", flush=True)
        results[batching] = {"ratio": median(ratios), "fair": median(fair),
                             **{mode: median(v) for mode, v in rates.items()}}
    return results


def run(messages: int, repeats: int) -> dict[str, dict]:
    with OncelogBroker() as broker:
        oncelog = run_pairs(broker.bootstrap, "oncelog", messages, repeats)
    with MockCluster() as mock:
        mocked = run_pairs(mock.bootstrap, "mock", messages, repeats)
    return {"oncelog": oncelog, "mock": mocked}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args, _ = parser.parse_known_args(argv)
    results = run(args.messages, args.repeats)
    print(f"idempotence_cost: {args.messages:,} messages of 1 KiB per run, acks=all, median of "
          f"{args.repeats} pairs")
    for batching in SCENARIOS:
        ours, mock = results["oncelog"][batching], results["mock"][batching]
        verdict = "ok" if ours["fair"] >= 0.97 else "MISS"
        print(f"  {batching:8s} oncelog msgs/s: plain {ours['plain']:,.0f}, plain@1 "
              f"{ours['plain@1']:,.0f}, idempotent {ours['idempotent']:,.0f}")
        print(f"  {batching:8s} idempotent / plain@1 (the broker's cost) = {ours['fair']:.3f} "
              f"(target >= 0.97: {verdict}); idempotent / plain (what a librdkafka user sees) "
              f"= {ours['ratio']:.3f}, on the mock {mock['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
