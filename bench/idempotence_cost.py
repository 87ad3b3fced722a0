"""The cost of idempotence: idempotent / plain produce throughput on one broker, one run.

    .venv/bin/python bench/idempotence_cost.py [--messages 200000] [--repeats 7]

confluent-kafka, 1 KiB values, acks=all, one partition, the same oncelog broker for both; the
runs alternate (plain, idempotent, plain, ...) so drift hits both alike, and each pair gives
a ratio. Printed: the median ratio per batching, for librdkafka's default batching and 16 KiB
batches. Target (issue 3): >= 0.97 (Kafka's published cost of idempotence is about 3%).

The same pairs are run against librdkafka's mock cluster in the same run: its ratio is the
client's own cost of idempotence (at most 5 requests in flight per partition, ordering
bookkeeping), which no broker can remove. oncelog's ratio over the mock's is the broker's part.
"""

from __future__ import annotations

import argparse
import sys

from _support import MockCluster, OncelogBroker, median
from produce_consume import SCENARIOS, _delete_topics, produce_throughput

MODES = {"plain": {"enable.idempotence": False}, "idempotent": {"enable.idempotence": True}}


def run_pairs(bootstrap: str, name: str, messages: int, repeats: int) -> dict:
    results: dict[str, dict[str, float]] = {}
    for batching, extra in SCENARIOS.items():
        ratios, rates = [], {mode: [] for mode in MODES}
        for rep in range(repeats):
            order = list(MODES) if rep % 2 == 0 else list(reversed(MODES))
            pair = {}
            for mode in order:
                topic = f"cost-{batching}-{mode}-{rep}"
                result = produce_throughput(bootstrap, topic, messages, {**extra, **MODES[mode]})
                pair[mode] = result.messages / result.seconds
                rates[mode].append(pair[mode])
                if name == "oncelog":
                    # Dirty pages piling up from run to run would slow the later runs.
                    _delete_topics(bootstrap, [topic])
            ratios.append(pair["idempotent"] / pair["plain"])
            print(f"  {name:8s} {batching:8s} #{rep + 1}: plain {pair['plain']:>10,.0f} msgs/s  "
                  f"idempotent {pair['idempotent']:>10,.0f} msgs/s  ratio {ratios[-1]:.3f}",
                  flush=True)
        results[batching] = {"ratio": median(ratios),
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
        verdict = "ok" if ours["ratio"] >= 0.97 else "MISS"
        print(f"  {batching:8s} oncelog: plain {ours['plain']:>10,.0f} msgs/s, idempotent "
              f"{ours['idempotent']:>10,.0f} msgs/s, idempotent / plain = {ours['ratio']:.3f} "
              f"(target >= 0.97: {verdict}); mock: {mock['ratio']:.3f}; "
              f"oncelog / mock = {ours['ratio'] / mock['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
