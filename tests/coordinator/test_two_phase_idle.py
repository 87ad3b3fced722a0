"""A prepared (two-phase commit) transaction in the transaction coordinator: no timeout ever
aborts it (KIP-939: only its external coordinator, say a Spark driver, decides, and after its
decision aborting would lose committed rows), and one open longer than
transaction.max.timeout.ms is logged once, naming it and its partitions."""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode as E
from support.transaction_coordinator_helpers import coordinator, run

from oncelog.coordinator.transaction.txn_records import TxnState as S


def test_a_prepared_transaction_is_never_aborted_by_a_timeout_but_logged(caplog):
    async def scenario():
        clock = [1_000_000]
        c = coordinator(clock=clock, two_phase_commit=True, max_timeout_ms=60_000)
        await c.load_all()
        error, pid, epoch, *_ = await c.init("spark-task", 60000, -1, -1, two_phase=True)
        assert error is E.none
        await c.add_partitions("spark-task", pid, epoch, [("t", 0)])
        with caplog.at_level(logging.WARNING,
                              "oncelog.coordinator.transaction.transaction_coordinator"):
            clock[0] += 30_000
            assert c.abort_timed_out() == 0
            assert caplog.records == []  # younger than transaction.max.timeout.ms
            for _ in range(3):  # past the coordinator's 2^31 - 1 ms "no timeout"
                clock[0] += 2**30
                assert c.abort_timed_out() == 0
        assert c.txns["spark-task"].state is S.ONGOING
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1, lines  # once per transaction
        assert "spark-task" in lines[0] and "t-0" in lines[0] and "prepared" in lines[0]
        c.close()
    run(scenario())
