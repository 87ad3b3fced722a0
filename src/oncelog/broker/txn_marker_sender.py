"""The transaction coordinator's markers in cluster mode: each partition's COMMIT / ABORT
marker goes to the partition's current leader (Kafka's TransactionMarkerChannelManager),
written here directly when this broker leads it, else sent as WriteTxnMarkers (v2, with the
coordinator epoch and the transaction version) over the inter-broker channel, one request
per leader for all its partitions.

Each round looks every partition's leader up again in the ZooKeeper-fed metadata cache, and
a round's outcome per partition is a row of this table (``outcome``):

    | # | a partition's answer                                  | outcome                    |
    |---|-------------------------------------------------------|----------------------------|
    |S1 | NONE                                                  | written                    |
    |S2 | its topic is not in the cluster's metadata (deleted): | skipped (answered          |
    |   | no leader to ask, or UNKNOWN_TOPIC_OR_PARTITION       | UNKNOWN_TOPIC_OR_PARTITION)|
    |S3 | INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED| given up: the producer or  |
    |   |                                                       | this coordinator is fenced |
    |S4 | anything else: NOT_LEADER_OR_FOLLOWER, no leader now, | again next round, with the |
    |   | UNKNOWN_TOPIC_OR_PARTITION of a topic the cache still | leader looked up again     |
    |   | has (its leader has not created it yet), the acks=all |                            |
    |   | errors, KAFKA_STORAGE_ERROR, a lost connection or no  |                            |
    |   | answer (NETWORK_EXCEPTION)                            |                            |

Rounds follow each other after a backoff of 50 ms doubling to 1 s, for at most
``ROUNDS_FOR_S``; what is still not written then is answered with its last error, and the
coordinator (transaction_coordinator.TransactionCoordinator._complete) asks again as long as
it is the transaction's coordinator and runs.

Until the coordinators move with the leadership of their internal partitions (issue 24's
``coordmove``), the internal topics are each broker's own and not in the cluster's metadata:
a marker for one of their partitions (``__consumer_offsets``, where TxnOffsetCommit's offsets
wait for it) goes to every live broker (``interim_every_broker``), where it is harmless when
that broker's partition holds nothing of the producer, and skipped on a broker no longer
registered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from ..cluster import znodes as zn
from ..protocol.api_versions import WRITE_TXN_MARKERS
from ..protocol.schema import build, request_module
from .apis.txn_markers import MARKER_TIMEOUT_S, write_markers
from .inter_broker import InterBrokerChannel, InterBrokerError
from .topics import INTERNAL_TOPICS

log = logging.getLogger(__name__)

E = ErrorCode
TopicPartition = tuple[str, int]
WRITE_TXN_MARKERS_VERSION = 2
ROUNDS_FOR_S = 30.0
BACKOFF_S = 0.05
BACKOFF_MAX_S = 1.0
# The answer can take the receiver's own acks=all wait: a little longer than that.
CALL_TIMEOUT_S = MARKER_TIMEOUT_S + 5.0
DELETED = -2  # "leader" of a partition the cluster's metadata does not have
FENCED = (E.invalid_producer_epoch, E.transaction_coordinator_fenced)


def outcome(error: ErrorCode, topic_known: bool) -> str:
    """Rows S1-S4: "written", "skipped", "given up" or "again"."""
    if error is E.none:
        return "written"
    if error is E.unknown_topic_or_partition and not topic_known:
        return "skipped"
    if error in FENCED:
        return "given up"
    return "again"


class MarkerSender:
    def __init__(self, broker, channel: InterBrokerChannel,
                 running: Callable[[], bool] = lambda: True) -> None:
        self.broker = broker
        self.channel = channel
        self.running = running

    async def write(self, producer_id: int, epoch: int, commit: bool, coordinator_epoch: int,
                    partitions: list[TopicPartition], transaction_version: int
                    ) -> dict[TopicPartition, ErrorCode]:
        """Each partition's final error (NONE: written)."""
        errors: dict[TopicPartition, ErrorCode] = {}
        # (partition, broker) pairs still to write: broker None is "its leader, now"
        todo: dict[tuple[TopicPartition, int | None], ErrorCode] = {}
        for tp in partitions:
            if tp[0] in INTERNAL_TOPICS and self._topic_known(tp[0]) is False:
                for b in self.interim_every_broker():
                    todo[(tp, b)] = E.none
            else:
                todo[(tp, None)] = E.none
        deadline = time.monotonic() + ROUNDS_FOR_S
        marker = (producer_id, epoch, commit, coordinator_epoch, transaction_version)
        # Each group of partitions is retried on its own: one leader slow to answer (its
        # acks=all waiting for a dead follower to leave the ISR) holds no other back.
        first: dict[int | None, list] = {}
        for key in todo:
            first.setdefault(key[1] if key[1] is not None else self._leader(key[0]),
                             []).append(key)
        rounds = {asyncio.ensure_future(self._round(marker, keys)): BACKOFF_S
                  for keys in first.values()}
        try:
            while rounds:
                left = deadline - time.monotonic()
                done, _ = await asyncio.wait(rounds, timeout=max(left, 0),
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break
                for finished in done:
                    delay = rounds.pop(finished)
                    again = self._take(finished.result(), todo, errors, marker)
                    if again and time.monotonic() < deadline and self.running():
                        rounds[asyncio.ensure_future(
                            self._later(delay, marker, again))] = min(BACKOFF_MAX_S, delay * 2)
        finally:
            for unfinished in rounds:
                unfinished.cancel()
        for (tp, _dest), error in todo.items():
            errors[tp] = error if error is not E.none else E.request_timed_out
        for tp in partitions:
            errors.setdefault(tp, E.none)
        return errors

    def _take(self, answers, todo, errors, marker) -> list:
        """Record one round's answers (rows S1-S4); the keys to ask again."""
        producer_id, epoch, commit = marker[:3]
        again = []
        for key, error in answers.items():
            tp, dest = key
            # a broker asked for its own internal partition may not have it: S2 there
            verdict = outcome(error, dest is None and self._topic_known(tp[0]))
            if verdict == "again":
                todo[key] = error
                again.append(key)
                continue
            del todo[key]
            if verdict == "given up":
                log.warning("%s marker of producer %d epoch %d for %s-%d refused: %s; "
                            "not sent again", "COMMIT" if commit else "ABORT",
                            producer_id, epoch, tp[0], tp[1], error.name)
            if errors.get(tp, E.none) is E.none:
                errors[tp] = E.none if verdict == "skipped" and dest is not None else error
        return again

    async def _later(self, delay: float, marker, keys):
        await asyncio.sleep(delay)
        return await self._round(marker, keys)

    def interim_every_broker(self) -> list[int]:
        """The live brokers (this one too): until coordmove, where an internal partition is."""
        return sorted({b.broker_id for b in self.broker.cluster.brokers} |
                      {self.broker.broker_id})

    def _topic_known(self, topic: str) -> bool:
        return self.broker.cluster_mode.cache.image.get(topic) is not None

    def _leader(self, tp: TopicPartition) -> int:
        """The partition's leader in the cluster's metadata now (zn.NO_LEADER: none now,
        DELETED: no such partition)."""
        image = self.broker.cluster_mode.cache.image.get(tp[0])
        if image is None or not 0 <= tp[1] < len(image.partitions):
            return DELETED
        return image.partitions[tp[1]].leader

    async def _round(self, marker, keys: list[tuple[TopicPartition, int | None]]
                     ) -> dict[tuple[TopicPartition, int | None], ErrorCode]:
        answers: dict[tuple[TopicPartition, int | None], ErrorCode] = {}
        by_broker: dict[int, list[tuple[TopicPartition, int | None]]] = {}
        live = self.interim_every_broker()
        for key in keys:
            tp, dest = key
            leader = dest if dest is not None else self._leader(tp)
            if dest is not None and dest not in live:
                answers[key] = E.unknown_topic_or_partition  # INTERIM: gone, nothing to end
            elif leader == DELETED:
                answers[key] = E.unknown_topic_or_partition
            elif leader == zn.NO_LEADER:
                answers[key] = E.leader_not_available
            else:
                by_broker.setdefault(leader, []).append(key)
        results = await asyncio.gather(*(self._send(b, marker, ks)
                                         for b, ks in by_broker.items()))
        for result in results:
            answers.update(result)
        return answers

    async def _send(self, dest: int, marker, keys: list[tuple[TopicPartition, int | None]]
                    ) -> dict[tuple[TopicPartition, int | None], ErrorCode]:
        producer_id, epoch, commit, coordinator_epoch, tv = marker
        tps = [tp for tp, _ in keys]
        if dest == self.broker.broker_id:
            errors = await write_markers(self.broker, producer_id, epoch, commit,
                                         coordinator_epoch, tps, tv)
            return {key: errors[key[0]] for key in keys}
        mod = request_module(WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION)
        by_topic: dict[str, list[int]] = {}
        for topic, index in tps:
            by_topic.setdefault(topic, []).append(index)
        body = build(mod.WriteTxnMarkersRequest, markers=(build(
            mod.WritableTxnMarker, producer_id=producer_id, producer_epoch=epoch,
            transaction_result=commit, coordinator_epoch=coordinator_epoch,
            transaction_version=tv, topics=tuple(
                build(mod.WritableTxnMarkerTopic, name=t, partition_indexes=tuple(ps))
                for t, ps in by_topic.items())),))
        try:
            answer = await self.channel.call(dest, WRITE_TXN_MARKERS,
                                             WRITE_TXN_MARKERS_VERSION, body, CALL_TIMEOUT_S)
        except InterBrokerError as exc:
            log.info("WriteTxnMarkers to broker %d: %s", dest, exc)
            return dict.fromkeys(keys, E.network_exception)
        got = {(t.name, p.partition_index): ErrorCode(p.error_code)
               for m in answer.markers for t in m.topics for p in t.partitions}
        return {key: got.get(key[0], E.unknown_server_error) for key in keys}
