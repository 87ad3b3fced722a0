"""TxnOffsetCommit on a cluster verifies the transaction with its coordinator (KIP-890 part
1, broker/txn_verification.py) and answers what the coordinator could not say as a
coordinator error every Kafka client retries (rows W1-W5): a Java producer takes
NOT_ENOUGH_REPLICAS in a TxnOffsetCommit answer as fatal ("Unexpected error in
TxnOffsetCommitResponse"), librdkafka as a reason to abort the transaction."""

from __future__ import annotations

from kio.schema.errors import ErrorCode
from support import txn_wire
from support.txn_cluster import TIMEOUT
from support.waits import wait_for

from oncelog.client.network import calls
from oncelog.client.network.connection import BrokerConnection
from oncelog.protocol import api_versions as apis


def test_txn_offset_commit_without_a_transaction_coordinator_is_retriable(zookeeper,
                                                                           start_broker):
    """``__transaction_state`` not created yet (nobody asked for a transaction coordinator):
    no coordinator to verify with (txn_verification.py P2). The group's coordinator answers
    COORDINATOR_NOT_AVAILABLE, not NOT_ENOUGH_REPLICAS."""
    broker = start_broker(**{"broker.id": "1", "zookeeper.connect":
                             zookeeper.chroot("txn-offsets-verify"),
                             "offsets.topic.num.partitions": "1",
                             "transaction.state.log.num.partitions": "1"})
    conn = BrokerConnection("127.0.0.1", broker.port, client_id="t", timeout=TIMEOUT)
    try:
        def group_coordinator() -> bool:
            answer = calls.find_coordinator_result(conn.call(
                apis.FIND_COORDINATOR, calls.find_coordinator_request("g")))
            return answer.error == ErrorCode.none

        wait_for(group_coordinator, TIMEOUT, "the group coordinator")
        answers = wait_for(
            lambda: (got := txn_wire.txn_offset_commit(conn, "never-found", 1000, 0, "g",
                                                       "t", {0: 5}))
            != [ErrorCode.coordinator_load_in_progress] and got,
            TIMEOUT, "the group coordinator loaded")
        assert answers == [ErrorCode.coordinator_not_available]
    finally:
        conn.close()
