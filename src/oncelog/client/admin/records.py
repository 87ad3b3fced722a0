"""oncelog.Admin's calls about a partition's records, each asked of the partition's leader:
ListOffsets, DeleteRecords, and DescribeProducers (KIP-664)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.schema import build
from ..network.connection import KafkaError
from .base import AdminBase


@dataclass(frozen=True, slots=True)
class ProducerInfo:
    producer_id: int
    epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int = -1  # of the last marker written for this producer; -1: none
    current_txn_start_offset: int = -1  # of its open transaction in the partition; -1: none


class RecordsAdmin(AdminBase):
    def list_offsets(self, wanted: dict[tuple[str, int], int], read_committed: bool = False
                     ) -> dict[tuple[str, int], int | KafkaError]:
        """ListOffsets of many partitions, each asked of its leader: (topic, partition) ->
        timestamp (calls.EARLIEST, calls.LATEST or milliseconds) in, offset (-1: no record at
        or after that time) or the partition's error out. ``read_committed``: as a
        read_committed consumer asks (LATEST is then the last stable offset)."""
        if not wanted:
            return {}
        isolation_level = int(read_committed)

        def request(by_topic):
            def make(mod, version):
                return build(mod.ListOffsetsRequest, replica_id=-1,
                             isolation_level=isolation_level, topics=tuple(
                                 build(mod.ListOffsetsTopic, name=topic, partitions=tuple(
                                     build(mod.ListOffsetsPartition, partition_index=p,
                                           current_leader_epoch=-1, timestamp=timestamp)
                                     for p, timestamp in parts))
                                 for topic, parts in by_topic.items()))
            return make

        return self._ask_leaders(wanted, apis.LIST_OFFSETS, request, lambda p: p.offset)

    def delete_records(self, before: dict[tuple[str, int], int]
                       ) -> dict[tuple[str, int], int | KafkaError]:
        """DeleteRecords: move each partition's log start to the offset given (-1: its high
        watermark), asked of its leader. (topic, partition) -> the log start after it (the
        low watermark), or the partition's error (OFFSET_OUT_OF_RANGE past the high
        watermark)."""
        def request(by_topic):
            def make(mod, version):
                return build(mod.DeleteRecordsRequest, timeout=self._timeout(), topics=tuple(
                    build(mod.DeleteRecordsTopic, name=topic, partitions=tuple(
                        build(mod.DeleteRecordsPartition, partition_index=p, offset=o)
                        for p, o in parts))
                    for topic, parts in by_topic.items()))
            return make

        return self._ask_leaders(before, apis.DELETE_RECORDS, request,
                                 lambda p: p.low_watermark)

    def _ask_leaders(self, wanted: dict[tuple[str, int], int], api_key: int,
                     request: Callable[[dict[str, list[tuple[int, int]]]], Any],
                     value_of: Callable[[Any], int]) -> dict[tuple[str, int], int | KafkaError]:
        """One request to each partition's leader, made by ``request`` from its partitions
        (topic -> [(partition, value)]): (topic, partition) -> ``value_of`` its answer, or
        its error."""
        def ask(conn, asked):
            response = conn.call(api_key, request(_by_topic(asked)))
            return {(t.name, p.partition_index): value_of(p) if p.error_code == ErrorCode.none
                    else KafkaError(p.error_code, f"{t.name}-{p.partition_index}")
                    for t in response.topics for p in t.partitions}

        return self._leader_call(wanted, ask)

    def describe_producers(self, topic: str,
                           partitions: list[int]) -> dict[int, list[ProducerInfo]]:
        """DescribeProducers (KIP-664): the idempotent producers each partition remembers,
        asked of each partition's leader (the one that knows them), as Kafka's admin does."""
        def ask(conn, asked):
            def make(mod, version):
                return build(mod.DescribeProducersRequest, topics=(
                    build(mod.TopicRequest, name=topic,
                          partition_indexes=tuple(sorted(asked.values()))),))

            response = conn.call(apis.DESCRIBE_PRODUCERS, make)
            return {(topic, p.partition_index): [
                ProducerInfo(s.producer_id, s.producer_epoch, s.last_sequence,
                             s.last_timestamp, s.coordinator_epoch, s.current_txn_start_offset)
                for s in p.active_producers] if p.error_code == ErrorCode.none
                else KafkaError(p.error_code, p.error_message or f"{topic}-{p.partition_index}")
                for t in response.topics for p in t.partitions}

        answers = self._leader_call({(topic, p): p for p in partitions}, ask)
        for answer in answers.values():
            if isinstance(answer, KafkaError):
                raise answer
        return {p: answer for (_, p), answer in answers.items()}


def _by_topic(wanted: dict[tuple[str, int], int]) -> dict[str, list[tuple[int, int]]]:
    """(topic, partition) -> value as each topic's (partition, value) pairs, in order."""
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (topic, partition), value in sorted(wanted.items()):
        by_topic.setdefault(topic, []).append((partition, value))
    return by_topic
