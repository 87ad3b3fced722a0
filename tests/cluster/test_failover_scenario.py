"""``oncelog scenario failover`` (issue 23; seed 004, case 2): the command starts ZooKeeper and
three brokers of its own, writes the seed's batches with acks=all, kills the leader, and
prints the story: the controller's new leader, the producer's retries of its last five
batches answered with their original offsets, the old leader truncating what only it had,
and an exactly-once verdict; its diagram is written like the other scenarios'."""

from __future__ import annotations

import re

from support.broker_forks import run_oncelog


def test_failover_scenario_tells_seed_004_case_2(tmp_path):
    diagram = tmp_path / "failover.html"
    done = run_oncelog("scenario", "failover", "--out", str(diagram), "--data-dir",
                       str(tmp_path / "cluster"), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"the controller elected broker \d at leader epoch 1 \(ISR", out), out
    assert "5 of 5 retries answered with their original offsets: broker" in out
    for label, offset in (("A", 114), ("B", 121), ("C", 125), ("D", 133), ("E", 143)):
        assert out.count(f"ACK {label} at offset {offset}") == 2  # first, then the retry
    assert "REQUEST_TIMED_OUT for X" in out and "ACK X at offset 151" in out
    assert re.search(r"back as a follower of broker \d: truncating from 155 to 151", out), out
    assert "X at 151-154, Y at 155-159" in out
    assert out.rstrip().endswith("5 of 5 retries answered with their original offsets")
    assert "failover: PASS: exactly once across the failover" in out
    assert "<svg" in diagram.read_text()
    listed = run_oncelog("scenario", "--list")
    assert "failover\tFailover: the leader dies" in listed.stdout
    for log in (tmp_path / "cluster").glob("broker-*.log"):
        assert "Traceback" not in log.read_text(), log
