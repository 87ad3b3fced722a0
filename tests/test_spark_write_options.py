"""The exactly-once write options and the sink's commit decisions, without Spark or a broker
(spark/options.py, spark/two_phase.py)."""

from __future__ import annotations

import pytest

from oncelog.spark.options import OptionError, write_options
from oncelog.spark.two_phase import Decision, task_transactional_id

B = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_guarantee_and_the_transactional_id_prefix():
    opts = write_options({**B, "topic": "out"})
    assert (opts.guarantee, opts.transactional_id_prefix) == ("exactly-once",
                                                               "oncelog-spark-out")
    assert write_options({**B, "guarantee": "At-Least-Once"}).guarantee == "at-least-once"
    assert write_options(B).transactional_id_prefix == "oncelog-spark-topics"
    given = write_options({**B, "transactionalidprefix": "orders-job"})  # as Spark hands it
    assert given.transactional_id_prefix == "orders-job"
    assert "transactionalIdPrefix" not in given.producer and "guarantee" not in given.producer
    # A stream's prefix is its query's: one per checkpoint location.
    one = write_options({**B, "topic": "t", "checkpointLocation": "/cp/a"}, streaming=True)
    two = write_options({**B, "topic": "t", "checkpointlocation": "/cp/b"}, streaming=True)
    assert one.transactional_id_prefix.startswith("oncelog-spark-stream-")
    assert one.transactional_id_prefix != two.transactional_id_prefix
    assert task_transactional_id("p", "r", 3, 17) == "p-r-3-17"


@pytest.mark.parametrize(("options", "message"), [
    ({"guarantee": "exactly_twice"}, "option guarantee: 'exactly_twice' must be exactly-once "
                                     "or at-least-once"),
    ({"kafka.transactional.id": "x"}, "option kafka.transactional.id: the oncelog sink sets the "
                                      "transactional settings itself"),
    ({"transaction.two.phase.commit.enable": "true"},
     "option transaction.two.phase.commit.enable: the oncelog sink sets"),
    ({"kafka.transaction.timeout.ms": "5"}, "option kafka.transaction.timeout.ms: the oncelog"),
    ({"transactionalIdPrefix": "a b"}, "option transactionalIdPrefix: 'a b' must be letters"),
    ({"transactionalIdPrefix": ""}, "option transactionalIdPrefix: '' must be letters"),
])
def test_bad_write_options_name_the_option(options, message):
    with pytest.raises(OptionError) as failed:
        write_options({**B, "topic": "t", **options})
    assert message in str(failed.value)


def test_a_decision_fits_a_group_offsets_metadata_and_reads_back():
    small = Decision("ab12", 7, frozenset({"p-ab12-0-1", "p-ab12-1-2"}))
    assert Decision.parse(small.metadata()) == small
    # Many tasks: compressed to fit offset.metadata.max.bytes (4096).
    many = Decision("ab12", -1, frozenset(f"job-ab12-{p}-{p + 1000}" for p in range(600)))
    text = many.metadata()
    assert text.startswith("z:") and len(text) <= 4000
    assert Decision.parse(text) == many
    for other in (None, "", "someone else's metadata", '{"run": 1}', "z:not base64"):
        assert Decision.parse(other) is None
