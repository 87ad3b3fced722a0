"""KIP-219: after an answer with throttle_time_ms > 0, oncelog's connections (the blocking
one of the admin and consumer, the asyncio one of the producer) send nothing more on that
connection until it has passed. The broker mutes the connection for it anyway, so what the
client does is seen on the wire: a relay between client and broker notes when each of the
client's bytes arrives. The throttle comes from a real quota: a CreateTopics refused by the
client id's controller_mutation_rate.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import threading
import time

import pytest
from kio.schema.errors import ErrorCode

from oncelog.client.admin.admin_quotas import alter_client_quotas
from oncelog.client.network.aio_connection import AsyncBrokerConnection
from oncelog.client.network.connection import BrokerConnection, connect
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build

TIMEOUT = 20.0
# 10 mutations a second over two one-second windows: a burst of 20. Thirty partitions take
# the bucket to -10, a second later it is back at zero: the next CreateTopics is refused
# with a throttle of up to a second.
RATE = 10.0
FIRST = 30


class Relay:
    """One client connection relayed to the broker; ``sent`` holds the monotonic times the
    client's bytes arrived, ``answered`` those the broker's were passed on (noted before they
    are: the client cannot have them earlier)."""

    def __init__(self, port: int) -> None:
        self.broker_port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(TIMEOUT)
        self.port = self.listener.getsockname()[1]
        self.sent: list[float] = []
        self.answered: list[float] = []
        self._threads = [threading.Thread(target=self._run, daemon=True)]
        self._threads[0].start()

    def _run(self) -> None:
        client, _ = self.listener.accept()
        broker = socket.create_connection(("127.0.0.1", self.broker_port), timeout=TIMEOUT)
        client.settimeout(TIMEOUT)
        back = threading.Thread(target=self._pump, args=(broker, client, self.answered),
                                daemon=True)
        back.start()
        self._threads.append(back)
        self._pump(client, broker, self.sent)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, times: list[float]) -> None:
        try:
            while data := source.recv(65536):
                times.append(time.monotonic())
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
        for thread in self._threads:
            thread.join(TIMEOUT)


@pytest.fixture(scope="module")
def throttling(tmp_path_factory):
    from support.brokers import BrokerProcess

    broker = BrokerProcess(tmp_path_factory.mktemp("throttle") / "broker", {
        "controller.quota.window.num": "2", "controller.quota.window.size.seconds": "1"}).start()
    with connect(broker.bootstrap, "quota-admin", TIMEOUT) as conn:
        assert alter_client_quotas(conn, [
            ({"client-id": name}, {"controller_mutation_rate": RATE})
            for name in ("sync-client", "async-client", "held-client")]) == [None] * 3
    yield broker
    assert broker.stop() == 0
    assert "Traceback" not in broker.log_text(), broker.log_text()


def _create(name: str, partitions: int):
    def make(mod, _version):
        return build(mod.CreateTopicsRequest, timeout=datetime.timedelta(seconds=TIMEOUT),
                     validate_only=False, topics=(build(
                         mod.CreatableTopic, name=name, num_partitions=partitions,
                         replication_factor=1, assignments=(), configs=()),))
    return make


def _metadata(mod, _version):
    return build(mod.MetadataRequest, topics=(), allow_auto_topic_creation=False,
                 include_topic_authorized_operations=False,
                 include_cluster_authorized_operations=False)


def _throttled_answer(response) -> float:
    """The refused CreateTopics' throttle, in seconds."""
    assert response.topics[0].error_code == ErrorCode.throttling_quota_exceeded
    throttle = response.throttle_time.total_seconds()
    assert throttle > 0
    return throttle


def test_the_blocking_connection_waits_out_a_throttle(throttling):
    relay = Relay(throttling.port)
    try:
        conn = BrokerConnection("127.0.0.1", relay.port, "sync-client", TIMEOUT)
        try:
            assert conn.call(apis.CREATE_TOPICS, _create("sync-a", FIRST)).topics[0] \
                .error_code == ErrorCode.none
            throttle = _throttled_answer(conn.call(apis.CREATE_TOPICS, _create("sync-b", 1)))
            answered = relay.answered[-1]  # the throttled answer's last bytes
            before = len(relay.sent)
            conn.call(apis.METADATA, _metadata)
            # throttle_time_ms is whole milliseconds: the wait is at least that
            assert relay.sent[before] - answered >= throttle - 0.001, (throttle, relay.sent)
        finally:
            conn.close()
    finally:
        relay.close()


def test_the_asyncio_connection_holds_its_requests_until_the_throttle_ends(throttling):
    relay = Relay(throttling.port)

    async def run() -> tuple[float, float]:
        conn = await AsyncBrokerConnection.open("127.0.0.1", relay.port, "async-client",
                                                TIMEOUT)
        try:
            first = await conn.request(apis.CREATE_TOPICS, _create("async-a", FIRST))
            assert first.topics[0].error_code == ErrorCode.none
            throttle = _throttled_answer(
                await conn.request(apis.CREATE_TOPICS, _create("async-b", 1)))
            answered = relay.answered[-1]
            before = len(relay.sent)
            # two at once: both held, both sent when the throttle ends, in order
            await asyncio.gather(conn.request(apis.METADATA, _metadata),
                                 conn.request(apis.METADATA, _metadata))
            return throttle, relay.sent[before] - answered
        finally:
            conn.close()

    try:
        throttle, waited = asyncio.run(run())
        assert waited >= throttle - 0.001, (throttle, waited)
    finally:
        relay.close()


def test_requests_held_by_a_throttle_and_failed_were_not_sent(throttling):
    """A request held back by a throttle was never written: when its connection fails (here:
    closed) meanwhile, it fails as RequestNotSent, which a caller may retry safely, and one
    expecting no answer is not reported done (before: a plain KafkaError, as for a request
    the broker may have seen, and None at once for the other)."""
    from oncelog.client.network.connection import RequestNotSent

    async def run() -> list:
        conn = await AsyncBrokerConnection.open("127.0.0.1", throttling.port, "held-client",
                                                TIMEOUT)
        try:
            first = await conn.request(apis.CREATE_TOPICS, _create("held-a", FIRST))
            assert first.topics[0].error_code == ErrorCode.none
            _throttled_answer(await conn.request(apis.CREATE_TOPICS, _create("held-b", 1)))
            held = [conn.request(apis.METADATA, _metadata),
                    conn.request(apis.METADATA, _metadata, expect_response=False)]
            assert not any(future.done() for future in held)
        finally:
            conn.close()
        return await asyncio.gather(*held, return_exceptions=True)

    assert [type(outcome) for outcome in asyncio.run(run())] == [RequestNotSent] * 2


@pytest.mark.parametrize("version", [3, 9, 11])
def test_where_the_clients_find_a_throttle(version):
    """The producer's own Produce decoder and the consumer's raw Fetch frames carry it too."""
    from oncelog.client.network.throttle import raw_throttle_seconds, throttle_seconds
    from oncelog.protocol import produce_response
    from oncelog.protocol.messages import encode_response
    from oncelog.protocol.schema import response_module

    frame = produce_response.encode(version, 7, [], throttle_ms=1234)[4:]
    assert throttle_seconds(produce_response.decode(version, frame)) == 1.234
    fetch_version = version + 1  # 4, 10 (not flexible) and 12 (flexible)
    mod = response_module(apis.FETCH, fetch_version)
    body = build(mod.FetchResponse, throttle_time=datetime.timedelta(milliseconds=250),
                 error_code=ErrorCode.none, session_id=0, responses=(), node_endpoints=())
    fetch = encode_response(apis.FETCH, fetch_version, 7, body)[4:]
    assert raw_throttle_seconds(apis.FETCH, fetch_version, fetch) == 0.25
