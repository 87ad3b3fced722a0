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
``ROUNDS_FOR_S``; what is still not written then is answered with its last error. What the
coordinator does with the answers (complete, stop for good on S3, send again) is its table's
rows M1-M3 (coordinator/transaction/txn_rules.py ``after_markers``).

``running`` (given with each ``write``) says whether this broker is still the transaction's
coordinator at the coordinator epoch the markers carry (coordinator/ownership.py); once it
is not, no round starts again: a deposed coordinator's markers would be fenced anyway, and
its successor sends them from the log. Markers for ``__consumer_offsets`` partitions (where
TxnOffsetCommit's offsets wait for them) go to their leader like any other.
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
    def __init__(self, broker, channel: InterBrokerChannel) -> None:
        self.broker = broker
        self.channel = channel

    async def write(self, producer_id: int, epoch: int, commit: bool, coordinator_epoch: int,
                    partitions: list[TopicPartition], transaction_version: int,
                    running: Callable[[], bool] = lambda: True
                    ) -> dict[TopicPartition, ErrorCode]:
        """Each partition's final error (NONE: written)."""
        errors: dict[TopicPartition, ErrorCode] = {}
        todo: dict[TopicPartition, ErrorCode] = dict.fromkeys(partitions, E.none)
        deadline = time.monotonic() + ROUNDS_FOR_S
        marker = (producer_id, epoch, commit, coordinator_epoch, transaction_version)
        # Each group of partitions is retried on its own: one leader slow to answer (its
        # acks=all waiting for a dead follower to leave the ISR) holds no other back.
        first: dict[int, list[TopicPartition]] = {}
        for tp in todo:
            first.setdefault(self._leader(tp), []).append(tp)
        rounds = {asyncio.ensure_future(self._round(marker, tps)): BACKOFF_S
                  for tps in first.values()}
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
                    if again and time.monotonic() < deadline and running():
                        rounds[asyncio.ensure_future(
                            self._later(delay, marker, again))] = min(BACKOFF_MAX_S, delay * 2)
        finally:
            for unfinished in rounds:
                unfinished.cancel()
        for tp, error in todo.items():
            errors[tp] = error if error is not E.none else E.request_timed_out
        return errors

    def _take(self, answers, todo, errors, marker) -> list[TopicPartition]:
        """Record one round's answers (rows S1-S4); the partitions to ask again."""
        producer_id, epoch, commit = marker[:3]
        again = []
        for tp, error in answers.items():
            verdict = outcome(error, self._topic_known(tp[0]))
            if verdict == "again":
                todo[tp] = error
                again.append(tp)
                continue
            del todo[tp]
            if verdict == "given up":
                log.warning("%s marker of producer %d epoch %d for %s-%d refused: %s; "
                            "not sent again", "COMMIT" if commit else "ABORT",
                            producer_id, epoch, tp[0], tp[1], error.name)
            errors[tp] = error
        return again

    async def _later(self, delay: float, marker, tps: list[TopicPartition]):
        await asyncio.sleep(delay)
        return await self._round(marker, tps)

    def _topic_known(self, topic: str) -> bool:
        return self.broker.cluster_mode.cache.image.get(topic) is not None

    def _leader(self, tp: TopicPartition) -> int:
        """The partition's leader in the cluster's metadata now (zn.NO_LEADER: none now,
        DELETED: no such partition)."""
        image = self.broker.cluster_mode.cache.image.get(tp[0])
        if image is None or not 0 <= tp[1] < len(image.partitions):
            return DELETED
        return image.partitions[tp[1]].leader

    async def _round(self, marker, tps: list[TopicPartition]
                     ) -> dict[TopicPartition, ErrorCode]:
        answers: dict[TopicPartition, ErrorCode] = {}
        by_broker: dict[int, list[TopicPartition]] = {}
        for tp in tps:
            leader = self._leader(tp)
            if leader == DELETED:
                answers[tp] = E.unknown_topic_or_partition
            elif leader == zn.NO_LEADER:
                answers[tp] = E.leader_not_available
            else:
                by_broker.setdefault(leader, []).append(tp)
        results = await asyncio.gather(*(self._send(b, marker, ps)
                                         for b, ps in by_broker.items()))
        for result in results:
            answers.update(result)
        return answers

    async def _send(self, dest: int, marker, tps: list[TopicPartition]
                    ) -> dict[TopicPartition, ErrorCode]:
        producer_id, epoch, commit, coordinator_epoch, tv = marker
        if dest == self.broker.broker_id:
            errors = await write_markers(self.broker, producer_id, epoch, commit,
                                         coordinator_epoch, tps, tv)
            return {tp: errors[tp] for tp in tps}
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
            return dict.fromkeys(tps, E.network_exception)
        got = {(t.name, p.partition_index): ErrorCode(p.error_code)
               for m in answer.markers for t in m.topics for p in t.partitions}
        return {tp: got.get(tp, E.unknown_server_error) for tp in tps}
