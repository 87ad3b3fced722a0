"""The oncelog command's client tools against a real broker."""

import subprocess
import sys


def oncelog(broker, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "oncelog", *args, "--bootstrap-server", broker.bootstrap],
        input=stdin, capture_output=True, text=True, timeout=60,
    )


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
