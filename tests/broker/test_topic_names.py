"""Topic names at Kafka's limits against a real broker (issue 28 #7): every legal name (up to
249 characters) can be created, written, moved between log directories and deleted; names
that differ only in '.' and '_' collide as in Kafka; no answer carries a server path."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

TIMEOUT = 20.0


def _error(future) -> ErrorCode | None:
    try:
        future.result(TIMEOUT)
    except KafkaException as exc:
        return ErrorCode(exc.args[0].code())
    return None


@pytest.mark.parametrize("length", [213, 216, 237, 238, 249])
def test_long_names_live_and_die(start_broker, tmp_path, length):
    broker = start_broker()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    name = f"n{length:03d}" + "x" * (length - 4)
    assert _error(admin.create_topics([NewTopic(name, 12, 1)])[name]) is None
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce(name, value=b"v", partition=11)
    assert producer.flush(TIMEOUT) == 0
    # Gone before the topic is: a producer that still knows the topic asks for it again
    # (librdkafka's producer: allow.auto.create.topics) and, as with Kafka, that creates it
    # anew, before or after the create below, depending on the machine's load.
    del producer
    assert _error(admin.delete_topics([name])[name]) is None
    broker.restart()  # nothing left behind to finish at start
    assert not [e for e in os.listdir(broker.data_dir) if e.startswith(name[:8])]
    assert _error(admin.create_topics([NewTopic(name, 1, 1)])[name]) is None


def test_colliding_names_are_refused(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert _error(admin.create_topics([NewTopic("metrics.x", 1, 1)])["metrics.x"]) is None
    for other in ("metrics_x", "metrics.x"):
        code = _error(admin.create_topics([NewTopic(other, 1, 1)])[other])
        assert code in (ErrorCode.invalid_topic_exception, ErrorCode.topic_already_exists)
    assert _error(admin.create_topics([NewTopic("metrics_x", 1, 1)])["metrics_x"]) == \
        ErrorCode.invalid_topic_exception
    # in one request too
    futures = admin.create_topics([NewTopic("a.b_c", 1, 1), NewTopic("a_b.c", 1, 1)])
    assert sorted(str(_error(f)) for f in futures.values()) == sorted(
        ["None", str(ErrorCode.invalid_topic_exception)])


def test_error_messages_carry_no_server_paths(broker):
    """An OSError's text names the file it failed on; the answer keeps the error, not the
    path. Here the metadata store's temporary file cannot be written (a directory stands
    where it goes)."""
    store = broker.data_dir / ".oncelog-metadata"
    blocker = store / ".pending.json.tmp"
    blocker.mkdir()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    future = admin.create_topics([NewTopic("blocked", 1, 1)])["blocked"]
    with pytest.raises(KafkaException) as caught:
        future.result(TIMEOUT)
    error = caught.value.args[0]
    assert error.code() == ErrorCode.kafka_storage_error
    assert "Is a directory" in error.str() and str(broker.data_dir) not in error.str() and \
        "/" not in error.str(), error.str()
    blocker.rmdir()
    assert _error(admin.create_topics([NewTopic("blocked", 1, 1)])["blocked"]) is None


@pytest.mark.parametrize("point", ["committed", None])
def test_a_249_character_topic_moves_between_log_dirs(tmp_path, point):
    """The move's "-future" and "-delete" directories cut the topic as Kafka does; a move
    killed after its commit is finished at the next start from the cut name."""
    from support.brokers import BrokerProcess

    from oncelog import Admin
    a, b = tmp_path / "a", tmp_path / "b"
    env = {"ONCELOG_LOG_DIR_MOVE_CRASH": point} if point else {}
    broker = BrokerProcess(a, {"log.dirs": f"{a},{b}"}, env=env).start()
    name = "m" * 249
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        assert _error(admin.create_topics([NewTopic(name, 1, 1)])[name]) is None
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        producer.produce(name, value=b"kept")
        assert producer.flush(TIMEOUT) == 0
        del producer
        with Admin({"bootstrap.servers": broker.bootstrap}) as ours:
            assert ours.alter_replica_log_dirs({(name, 0): str(b)}) == {(name, 0): 0}
        if point:
            assert broker.proc is not None
            broker.proc.wait(TIMEOUT)  # it killed itself after the commit
            broker.proc = None
            broker.env = {}
            broker.start()
        deadline = time.monotonic() + TIMEOUT
        while os.listdir(b) != [f"{name}-0"] or os.listdir(a) != [".oncelog-metadata"]:
            assert time.monotonic() < deadline, (os.listdir(a), os.listdir(b))
            time.sleep(0.05)
        from support.brokers import read_to_end
        assert [v for _, v in read_to_end(broker.bootstrap, name)[0]] == [b"kept"]
    finally:
        if broker.alive:
            broker.stop()
    assert "Traceback" not in broker.log_text(), broker.log_text()
