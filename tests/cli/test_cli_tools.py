"""The oncelog command's client tools against a real broker."""

import subprocess

from support.broker_forks import run_oncelog

import oncelog as oncelog_package


def oncelog(broker, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return run_oncelog(*args, "--bootstrap-server", broker.bootstrap, input=stdin)


def test_topic_lifecycle_produce_and_consume(broker):
    created = oncelog(broker, "topics", "create", "--topic", "orders", "--partitions", "3",
                      "--config", "retention.ms=3600000")
    assert created.returncode == 0, created.stderr
    assert oncelog(broker, "topics", "list").stdout.split() == ["orders"]

    lines = "".join(f"user{i}:order {i}\n" for i in range(30))
    produced = oncelog(broker, "produce", "--topic", "orders", "--key-separator", ":",
                       "--compression", "gzip", "--header", "source=test", stdin=lines)
    assert produced.returncode == 0, produced.stderr

    described = oncelog(broker, "topics", "describe", "--topic", "orders").stdout
    assert "PartitionCount: 3" in described
    assert "retention.ms=3600000" in described

    consumed = oncelog(broker, "consume", "--topic", "orders", "--exit-at-end", "--print-key",
                       "--print-headers")
    assert consumed.returncode == 0, consumed.stderr
    rows = sorted(line.split("\t") for line in consumed.stdout.splitlines())
    assert rows == sorted([f"user{i}", "source=test", f"order {i}"] for i in range(30))

    one = oncelog(broker, "consume", "--topic", "orders", "--partition", "0", "--offset", "1",
                  "--max-messages", "1", "--print-offset")
    assert one.stdout.startswith("0:1\t")

    assert oncelog(broker, "topics", "delete", "--topic", "orders").returncode == 0
    again = oncelog(broker, "topics", "delete", "--topic", "orders")
    assert again.returncode == 1
    assert "UNKNOWN_TOPIC_OR_PARTITION" in again.stderr


def test_errors_are_reported_not_raised(broker):
    bad = oncelog(broker, "topics", "create", "--topic", "bad/name")
    assert bad.returncode == 1
    assert "INVALID_TOPIC_EXCEPTION" in bad.stderr
    assert "Traceback" not in bad.stderr
    missing = oncelog(broker, "consume", "--topic", "nope", "--exit-at-end")
    assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr


def stats_of(broker) -> subprocess.CompletedProcess:
    return oncelog(broker, "stats", "--metrics-server", f"127.0.0.1:{broker.metrics_port}")


def test_producers_describe_and_stats(broker):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for i in range(50):
        producer.produce("idem", value=b"%d" % i, partition=0)
    assert producer.flush(30) == 0
    described = oncelog(broker, "producers", "describe", "--topic", "idem")
    assert described.returncode == 0, described.stderr
    header, row = described.stdout.splitlines()
    assert header.split("\t")[:4] == ["PARTITION", "PRODUCER_ID", "EPOCH", "LAST_SEQUENCE"]
    partition, _, epoch, last_sequence, _ = row.split("\t")
    assert (partition, epoch, last_sequence) == ("0", "0", "49")

    stats = stats_of(broker)
    assert stats.returncode == 0, stats.stderr
    rows = [line.split("\t") for line in stats.stdout.splitlines()[1:]]
    appended = sum(int(r[3]) for r in rows if r[:3] == ["idem", "0", "appended"])
    assert appended >= 1
    assert ["idem", "0", "producers", "1"] in rows


def test_deleted_topic_leaves_no_counters(broker):
    assert oncelog(broker, "topics", "create", "--topic", "gone").returncode == 0
    assert oncelog(broker, "produce", "--topic", "gone", stdin="a\n").returncode == 0
    assert "gone\t0\tappended" in stats_of(broker).stdout
    assert oncelog(broker, "topics", "delete", "--topic", "gone").returncode == 0
    assert "gone" not in stats_of(broker).stdout


def test_produce_is_idempotent_and_takes_producer_properties(broker):
    produced = oncelog(broker, "produce", "--topic", "cli-idem", "--partition", "0",
                       "--producer-property", "linger.ms=1", stdin="a\nb\nc\n")
    assert produced.returncode == 0, produced.stderr
    with oncelog_package.Consumer({"bootstrap.servers": broker.bootstrap,
                                   "auto.offset.reset": "earliest"}) as c:
        c.assign([("cli-idem", 0)])
        records = list(c)
    assert [(r.value, r.sequence) for r in records] == [(b"a", 0), (b"b", 1), (b"c", 2)]
    assert records[0].producer_id >= 0

    refused = oncelog(broker, "produce", "--topic", "cli-idem", "--producer-property",
                      "max.in.flight.requests.per.connection=9", "--producer-property",
                      "enable.idempotence=true", stdin="x\n")
    assert refused.returncode != 0
    assert "at most 5" in refused.stderr
    missing = oncelog(broker, "produce", "--topic", "cli-idem", "--partition", "7", stdin="x\n")
    assert missing.returncode == 1
    assert "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr
