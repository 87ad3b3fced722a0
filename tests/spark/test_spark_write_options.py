"""The exactly-once write options and the sink's commit decisions, without Spark or a broker
(spark/options.py, spark/two_phase.py)."""

from __future__ import annotations

import re

import pytest

from oncelog.protocol.client_regex import compile_client_regex
from oncelog.spark.options import OptionError, write_options
from oncelog.spark.two_phase import (
    Decision,
    _pattern,
    prefix_of,
    stream_prefix,
    task_transactional_id,
)

B = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_guarantee_and_the_transactional_id_prefix():
    opts = write_options({**B, "topic": "out"})
    assert opts.guarantee == "exactly-once"
    assert write_options({**B, "guarantee": "At-Least-Once"}).guarantee == "at-least-once"
    # A batch write's default prefix is its save()'s own: two writes to one topic never share
    # it (one's recovery would end the other's transactions).
    assert re.fullmatch(r"oncelog-spark-out-[0-9a-f]{12}", opts.transactional_id_prefix)
    assert write_options({**B, "topic": "out"}).transactional_id_prefix != \
        opts.transactional_id_prefix
    assert re.fullmatch(r"oncelog-spark-topics-[0-9a-f]{12}",
                        write_options(B).transactional_id_prefix)
    given = write_options({**B, "transactionalidprefix": "orders-job"})  # as Spark hands it
    assert given.transactional_id_prefix == "orders-job"
    assert "transactionalIdPrefix" not in given.producer and "guarantee" not in given.producer
    # A stream's is its query's, named by the tasks (they see the query id), whatever the
    # checkpoint's spelling: none here.
    for checkpoint in ("/cp/a", "/cp/a/", "file:/cp/a"):
        assert write_options({**B, "topic": "t", "checkpointLocation": checkpoint},
                             streaming=True).transactional_id_prefix is None
    assert stream_prefix("0f1e-2d") == "oncelog-spark-stream-0f1e-2d"
    assert task_transactional_id("p", "r", 3, 17) == "p-r-3-17"


def test_the_task_ids_of_a_prefix_and_no_others_match_its_pattern():
    """ListTransactions' filter (a regex the broker matches whole, with RE2 as Kafka does
    with RE2/J): the ids of prefix orders are not orders-eu's, a batch write to a topic
    named stream does not take every stream's, and a dot is a dot."""
    ids = {
        "orders": "orders-0123abcd-0-7",
        "orders-eu": "orders-eu-0123abcd-1-8",
        "oncelog-spark-stream-aaaabbbbcccc": "oncelog-spark-stream-aaaabbbbcccc-89abcdef-0-3",
        "oncelog-spark-stream-0f1e-2d": "oncelog-spark-stream-0f1e-2d-89abcdef-12-30",
        "a.b": "a.b-00000000-0-0",
        "axb": "axb-00000000-0-0",
    }
    for prefix in ids:
        pattern = compile_client_regex(_pattern(prefix))
        assert [p for p, t in ids.items() if pattern.fullmatch(t)] == [prefix]
        assert prefix_of(ids[prefix]) == prefix
        run = compile_client_regex(_pattern(prefix, ids[prefix].rsplit("-", 3)[1]))
        assert [p for p, t in ids.items() if run.fullmatch(t)] == [prefix]
        assert not pattern.fullmatch(prefix)  # the driver's own id is not a task's
    assert prefix_of("orders") is None
    with pytest.raises(ValueError):
        _pattern("p", ".*")


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
    of_query = Decision("ab12", 3, frozenset({"p-ab12-0-1"}), "1b4e28ba-2fa1")
    assert Decision.parse(of_query.metadata()) == of_query
    # Many tasks: compressed to fit offset.metadata.max.bytes (4096).
    many = Decision("ab12", -1, frozenset(f"job-ab12-{p}-{p + 1000}" for p in range(600)))
    text = many.metadata()
    assert text.startswith("z:") and len(text) <= 4000
    assert Decision.parse(text) == many
    for other in (None, "", "someone else's metadata", '{"run": 1}', "z:not base64"):
        assert Decision.parse(other) is None
