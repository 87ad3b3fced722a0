"""What tests besides tests/producer_state/test_txn_storage.py use of it."""
from __future__ import annotations

from kio.schema.errors import ErrorCode

E = ErrorCode


class Issued:
    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < 100

    def highest_claimed(self) -> int:
        return 99


def accept(_pid: int, _epoch: int) -> ErrorCode:
    return E.none
