"""A transactional id longer than its `__transaction_state` key can hold (an int16-length
STRING) is refused with INVALID_REQUEST, as an empty one is; the connection and the broker
stay up (before: the record writer raised and the connection closed with a traceback)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode as E
from support.txn_wire import add_partitions, end_txn, init_producer_id

from oncelog.client.network.connection import BrokerConnection


def test_an_id_longer_than_its_record_key_is_an_invalid_request(broker):
    host, port = broker.bootstrap.split(":")
    conn = BrokerConnection(host, int(port))
    too_long = "t" * 40_000
    assert init_producer_id(conn, too_long)[0] == E.invalid_request
    assert set(add_partitions(conn, too_long, 0, 0, [("x", 0)]).values()) == {E.invalid_request}
    assert end_txn(conn, too_long, 0, 0, commit=True)[0] == E.invalid_request
    # the same connection goes on, and an id at the limit works
    error, pid, epoch = init_producer_id(conn, "t" * 32_767)
    assert error == E.none and pid >= 0 and epoch >= 0
