"""The inter-broker channel (broker/inter_broker.py) against a real broker and against a
peer that never answers, and the decision tables of the markers sent across brokers
(broker/txn_marker_sender.py, rows S1-S4) and of KIP-890 verification with a remote
coordinator (broker/txn_verification.py, rows P1-P5)."""

from __future__ import annotations

import asyncio
import datetime
import struct
from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode

from oncelog.broker.inter_broker import InterBrokerChannel, InterBrokerError, connect
from oncelog.broker.txn_marker_sender import outcome
from oncelog.broker.txn_verification import TxnVerification, for_offset_commit, for_producer
from oncelog.protocol.api_versions import ADD_PARTITIONS_TO_TXN, API_VERSIONS_KEY, METADATA
from oncelog.protocol.messages import encode_response, peek_header
from oncelog.protocol.schema import build, request_module, response_module

E = ErrorCode


def _plain(endpoint_of):
    """An opener of plain TCP connections to ``endpoint_of(broker id)`` (None: unregistered,
    refused as inter_broker_connect.endpoint_of refuses it)."""
    async def open_to(broker_id: int):
        endpoint = endpoint_of(broker_id)
        if endpoint is None:
            raise ConnectionError(f"broker {broker_id} is not registered")
        return await asyncio.open_connection(*endpoint)
    return open_to


def _api_versions():
    mod = request_module(API_VERSIONS_KEY, 3)
    return build(mod.ApiVersionsRequest, client_software_name="oncelog-test",
                 client_software_version="1")


def _metadata():
    mod = request_module(METADATA, 12)
    return build(mod.MetadataRequest, topics=(), allow_auto_topic_creation=False,
                 include_topic_authorized_operations=False,
                 include_cluster_authorized_operations=False)


def test_overlapping_calls_on_one_connection_each_get_their_answer(broker):
    async def run():
        channel = InterBrokerChannel(
            7, _plain(lambda b: ("127.0.0.1", broker.port) if b == 1 else None))
        try:
            answers = await asyncio.gather(*(
                channel.call(1, API_VERSIONS_KEY, 3, _api_versions()) if i % 2 else
                channel.call(1, METADATA, 12, _metadata()) for i in range(20)))
            assert len(channel._connections) == 1  # one connection, pipelined
            for i, answer in enumerate(answers):
                assert hasattr(answer, "api_keys") == bool(i % 2)
                assert answer.error_code == E.none if i % 2 else answer.brokers
            with pytest.raises(InterBrokerError, match="not registered"):
                await channel.call(2, API_VERSIONS_KEY, 3, _api_versions())
        finally:
            channel.close()
        with pytest.raises(InterBrokerError, match="shutting down"):
            await channel.call(1, API_VERSIONS_KEY, 3, _api_versions())

    asyncio.run(run())


def test_a_call_given_up_leaves_the_connection_to_the_others(broker):
    """A call cancelled before its answer came (its client went away, or a marker round was
    given up): the answer, when it comes, is dropped; the other calls on the connection go
    on (before, its correlation id was taken for a stray answer, which failed them all)."""
    async def run():
        channel = InterBrokerChannel(
            7, _plain(lambda b: ("127.0.0.1", broker.port) if b == 1 else None))
        try:
            await channel.call(1, API_VERSIONS_KEY, 3, _api_versions())  # connected
            conn = channel._connections[1]
            given_up = asyncio.ensure_future(channel.call(1, METADATA, 12, _metadata()))
            await asyncio.sleep(0)  # sent, not yet answered
            given_up.cancel()
            answers = await asyncio.gather(*(
                channel.call(1, API_VERSIONS_KEY, 3, _api_versions()) for _ in range(5)))
            assert all(a.error_code == E.none for a in answers)
            assert channel._connections[1] is conn and not conn.closed
            assert not conn._abandoned  # the given-up answer came and was dropped
        finally:
            channel.close()

    asyncio.run(run())


def test_a_peer_that_never_answers_times_out_and_is_connected_again():
    async def run():
        accepted = []

        async def silent(reader, writer):
            accepted.append(writer)
            await reader.read()  # reads everything, answers nothing

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        channel = InterBrokerChannel(7, _plain(lambda b: ("127.0.0.1", port)), timeout_s=0.2)
        try:
            for attempt in (1, 2):
                with pytest.raises(InterBrokerError):
                    await channel.call(3, API_VERSIONS_KEY, 3, _api_versions())
                assert len(accepted) == attempt  # the timed-out connection was dropped
            # after a loss the next attempt waits reconnect.backoff.ms, doubling
            assert channel._backoff[3][1] == 0.05
        finally:
            channel.close()
            for writer in accepted:
                writer.close()
            server.close()
            await server.wait_closed()

    asyncio.run(run())


def test_a_call_waiting_when_its_connection_is_closed_fails_at_once():
    """A fetcher dropping its connection (a leader change) fails the Fetch waiting on it
    then, not after its 30 s timeout (found in review when the answers moved to
    frame_receiver.py: closing no longer cancelled a reader task that failed them)."""
    async def run():
        accepted = []

        async def silent(reader, writer):
            accepted.append(writer)
            await reader.read()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = await connect(_plain(lambda b: ("127.0.0.1", port)), 3, "t", timeout_s=30)
        try:
            waiting = asyncio.ensure_future(conn.call(API_VERSIONS_KEY, 3, _api_versions()))
            await asyncio.sleep(0.05)
            conn.close()
            async with asyncio.timeout(5):
                with pytest.raises(InterBrokerError):
                    await waiting
        finally:
            for writer in accepted:
                writer.close()
            server.close()
            await server.wait_closed()

    asyncio.run(run())


def test_connecting_nowhere_backs_off_doubling_to_a_bound():
    async def run():
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()  # nothing listens there now
        channel = InterBrokerChannel(7, _plain(lambda b: ("127.0.0.1", port)))
        delays = []
        for _ in range(6):
            with pytest.raises(InterBrokerError):
                await channel.call(2, API_VERSIONS_KEY, 3, _api_versions())
            delays.append(channel._backoff[2][1])
            channel._backoff[2] = (0.0, channel._backoff[2][1])  # no need to wait it out
        channel.close()
        assert delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]

    asyncio.run(run())


def test_each_marker_answer_is_one_row():
    """Rows S1-S4 of txn_marker_sender: written, skipped (a deleted topic), given up
    (fenced), or asked again."""
    for error in ErrorCode:
        known, gone = outcome(error, True), outcome(error, False)
        if error is E.none:
            assert known == gone == "written"
        elif error is E.unknown_topic_or_partition:
            assert (known, gone) == ("again", "skipped")
        elif error in (E.invalid_producer_epoch, E.transaction_coordinator_fenced):
            assert known == gone == "given up"
        else:
            assert known == gone == "again", error


def test_each_verification_answer_is_one_row():
    """Rows P1-P5 of txn_verification, as Kafka answers the producer."""
    retriable = {E.network_exception, E.not_coordinator, E.coordinator_not_available,
                 E.coordinator_load_in_progress, E.concurrent_transactions}
    for error in ErrorCode:
        expected = E.not_enough_replicas if error in retriable \
            else E.invalid_producer_epoch if error is E.producer_fenced else error
        assert for_producer(error) is expected
        whole = E.invalid_txn_state if error is E.cluster_authorization_failed else expected
        assert for_producer(error, whole_request=True) is whole


def test_a_partition_the_coordinators_answer_leaves_out_is_not_verified():
    """P2: the remote coordinator's AddPartitionsToTxn v4 ``verify_only`` answer names one
    of the two partitions asked, and names the other only under another transactional id:
    the first is verified, the other answered as no answer (NOT_ENOUGH_REPLICAS, retried),
    never NONE (before: a partition missing from the answer was taken as verified, and its
    batch began a transaction the coordinator does not know)."""
    mod = response_module(ADD_PARTITIONS_TO_TXN, 4)

    def result(txn_id, topic, index):
        return build(mod.AddPartitionsToTxnResult, transactional_id=txn_id, topic_results=(
            build(mod.AddPartitionsToTxnTopicResult, name=topic, results_by_partition=(
                build(mod.AddPartitionsToTxnPartitionResult, partition_index=index,
                      partition_error_code=E.none),)),))

    answer = build(mod.AddPartitionsToTxnResponse, throttle_time=datetime.timedelta(0),
                   error_code=E.none,
                   results_by_transaction=(result("another-id", "t", 1),
                                           result("tx", "t", 0)))

    async def run():
        async def coordinator(reader, writer):
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            _, _, correlation = peek_header(await reader.readexactly(size))
            writer.write(encode_response(ADD_PARTITIONS_TO_TXN, 4, correlation, answer))
            await writer.drain()
            await reader.read()

        server = await asyncio.start_server(coordinator, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        channel = InterBrokerChannel(7, _plain(lambda b: ("127.0.0.1", port)))
        try:
            verification = TxnVerification(SimpleNamespace(broker_id=7), channel)
            got = await verification.verify("tx", 1000, 0, [("t", 0), ("t", 1)], 1)
            assert got == {("t", 0): E.none, ("t", 1): E.not_enough_replicas}
        finally:
            channel.close()
            server.close()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(run(), 10))


def test_each_offset_commit_verification_answer_is_one_row():
    """Rows W1-W5 of txn_verification: what TxnOffsetCommit answers for the coordinator's
    verification, only errors a Kafka client's TxnOffsetCommit handler retries or knows."""
    retriable = {E.network_exception, E.not_coordinator, E.coordinator_not_available,
                 E.coordinator_load_in_progress, E.concurrent_transactions,
                 E.not_enough_replicas}
    for error in ErrorCode:
        expected = E.coordinator_not_available if error in retriable \
            else E.producer_fenced if error in (E.producer_fenced, E.invalid_producer_epoch) \
            else error
        assert for_offset_commit(error) is expected
        whole = E.invalid_txn_state if error is E.cluster_authorization_failed else expected
        assert for_offset_commit(error, whole_request=True) is whole


def test_a_produce_ending_leaves_another_ones_verification_in_place():
    """Two produce requests verifying the same producer's batch (a retry racing its first
    attempt): the first to end forgets only its own hold on the answer, the other still
    reads the coordinator's NONE (before, it fell back to the coordinator on this broker,
    which does not serve the id: a needless NOT_ENOUGH_REPLICAS); once both ended, nothing
    is kept."""
    mod = response_module(ADD_PARTITIONS_TO_TXN, 4)
    answer = build(mod.AddPartitionsToTxnResponse, throttle_time=datetime.timedelta(0),
                   error_code=E.none, results_by_transaction=(build(
                       mod.AddPartitionsToTxnResult, transactional_id="tx", topic_results=(
                           build(mod.AddPartitionsToTxnTopicResult, name="t",
                                 results_by_partition=(build(
                                     mod.AddPartitionsToTxnPartitionResult, partition_index=0,
                                     partition_error_code=E.none),)),)),))

    async def run():
        async def coordinator(reader, writer):
            while True:
                try:
                    (size,) = struct.unpack(">i", await reader.readexactly(4))
                except asyncio.IncompleteReadError:
                    return
                _, _, correlation = peek_header(await reader.readexactly(size))
                writer.write(encode_response(ADD_PARTITIONS_TO_TXN, 4, correlation, answer))
                await writer.drain()

        server = await asyncio.start_server(coordinator, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        channel = InterBrokerChannel(7, _plain(lambda b: ("127.0.0.1", port)))
        not_here = SimpleNamespace(verify=lambda *asked: E.not_enough_replicas)
        try:
            verification = TxnVerification(SimpleNamespace(broker_id=7,
                                                           transactions=not_here), channel)
            wanted = {(1000, 0): [("t", 0)]}
            first = await verification._fetch("tx", 1, wanted)
            second = await verification._fetch("tx", 1, wanted)
            verification.forget(first)
            assert verification("tx", 1000, 0, "t", 0) is E.none
            verification.forget(second)
            assert verification("tx", 1000, 0, "t", 0) is E.not_enough_replicas
            assert not verification._answers
        finally:
            channel.close()
            server.close()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(run(), 10))
