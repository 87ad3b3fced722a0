"""ProducerIdManager: producer ids from blocks claimed in the metadata store.

The seeds' ``/latest_producer_id_block`` protocol: the store holds the last block any broker
claimed, as ``{"version": 1, "broker": B, "block_start": "S", "block_end": "E"}``; a broker
claims the next 1000 ids with a compare-and-set on the node's version, so two brokers never get
the same block and a restarted broker never reissues an id. Ids are never reused: running out
of the 64-bit space is an error.
"""

from __future__ import annotations

import logging

from ..metadata.store import NO_VERSION, BadVersion, MetadataStore, race_attempts

log = logging.getLogger(__name__)

BLOCK_PATH = "latest_producer_id_block"
BLOCK_SIZE = 1000
MAX_PRODUCER_ID = (1 << 63) - 1
class ProducerIdsExhausted(Exception):
    pass


class ProducerIdManager:
    def __init__(self, store: MetadataStore, broker_id: int, block_size: int = BLOCK_SIZE) -> None:
        self.store = store
        self.broker_id = broker_id
        self.block_size = block_size
        self._next = 0
        self._block_end = -1  # nothing claimed yet by this broker
        self._highest_claimed = self._read_highest()

    def _read_highest(self) -> int:
        value, _ = self.store.get(BLOCK_PATH)
        return -1 if value is None else int(value["block_end"])

    def generate(self) -> int:
        if self._next > self._block_end:
            self._claim_block()
        pid = self._next
        self._next += 1
        return pid

    def _claim_block(self) -> None:
        for _ in race_attempts("claim a producer id block"):
            value, version = self.store.get(BLOCK_PATH)
            start = 0 if value is None else int(value["block_end"]) + 1
            if start > MAX_PRODUCER_ID - self.block_size + 1:
                raise ProducerIdsExhausted("every producer id has been issued")
            end = start + self.block_size - 1
            claim = {"version": 1, "broker": self.broker_id, "block_start": str(start),
                     "block_end": str(end)}
            try:
                self.store.compare_and_set(BLOCK_PATH, claim,
                                           NO_VERSION if value is None else version)
            except BadVersion:
                continue  # another broker claimed first: try the block after theirs
            self._next, self._block_end = start, end
            self._highest_claimed = max(self._highest_claimed, end)
            log.info("claimed producer id block %d..%d", start, end)
            return

    def highest_claimed(self) -> int:
        """No producer id above this was ever handed out, by any broker."""
        self._highest_claimed = max(self._highest_claimed, self._read_highest())
        return self._highest_claimed

    def is_issued(self, producer_id: int) -> bool:
        """Whether the cluster ever handed out ``producer_id`` (or at least claimed it)."""
        if 0 <= producer_id <= self._highest_claimed:
            return True
        self._highest_claimed = self._read_highest()  # another broker may have claimed since
        return 0 <= producer_id <= self._highest_claimed


def carry_over(source: MetadataStore, target: MetadataStore, broker_id: int) -> None:
    """A broker whose blocks came from ``source`` (its local store) now claims them from
    ``target`` (ZooKeeper, on joining a cluster): the target's latest block is raised to end
    at or above the source's, so no id this broker handed out before is handed out again by
    any broker. A block written here is one more claim, by the same conditional write."""
    value, _ = source.get(BLOCK_PATH)
    if value is None:
        return
    end = int(value["block_end"])
    for _ in race_attempts("carry producer id blocks over"):
        held, version = target.get(BLOCK_PATH)
        start = 0 if held is None else int(held["block_end"]) + 1
        if start > end:
            return
        claim = {"version": 1, "broker": broker_id, "block_start": str(start),
                 "block_end": str(end)}
        try:
            target.compare_and_set(BLOCK_PATH, claim, NO_VERSION if held is None else version)
        except BadVersion:
            continue
        log.info("producer ids up to %d of the local store reserved in the cluster's", end)
        return

