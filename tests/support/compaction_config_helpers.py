"""What tests besides tests/broker/test_compaction_config.py use of it."""
from __future__ import annotations


class NoProducers:
    def is_issued(self, producer_id: int) -> bool:
        return False

    def highest_claimed(self) -> int:
        return -1
