"""What tests besides tests/audit/test_audit.py use of it."""
from __future__ import annotations

import datetime
import time

from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from oncelog.cli.main import main
from oncelog.client.admin.admin import Admin
from oncelog.client.network import calls
from oncelog.client.network.connection import BrokerConnection
from oncelog.protocol import api_versions as apis
from oncelog.protocol.record_batch import BatchHeader
from oncelog.protocol.records import encode_batch
from oncelog.protocol.schema import build

TIMEOUT = 20.0  # seconds: the bound on any single wait


T0 = 1_700_000_000_000  # CreateTime of hand-built records, in ms


def header(pid: int, epoch: int, seq: int, n: int, offset: int = 0, records: int | None = None,
           attributes: int = 0) -> BatchHeader:
    """A batch header as the audit sees it; ``records`` below ``n`` is a compacted batch."""
    return BatchHeader(base_offset=offset, batch_length=100, partition_leader_epoch=0, magic=2,
                       crc=0, attributes=attributes, last_offset_delta=n - 1,
                       base_timestamp=T0, max_timestamp=T0, producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq,
                       records_count=n if records is None else records)


def produce(bootstrap: str, topic: str, items, **config) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "message.timeout.ms": int(TIMEOUT * 1000), **config})
    errors = []
    for partition, value in items:
        producer.produce(topic, value=value, partition=partition,
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(TIMEOUT) == 0
    assert errors == []


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["audit", *argv])
    return code, capsys.readouterr().out


def init_producer_id(conn: BrokerConnection) -> int:
    def make(mod, version):
        return build(mod.InitProducerIdRequest, transactional_id=None,
                     transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1,
                     producer_epoch=-1)

    response = conn.call(apis.INIT_PRODUCER_ID, make)
    assert response.error_code == ErrorCode.none, response
    return response.producer_id


def batch(pid: int, epoch: int, seq: int, values: list[bytes]) -> bytes:
    return encode_batch([(None, v, (), T0 + i) for i, v in enumerate(values)],
                        producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def store_forgetting(bootstrap: str, topic: str, batches) -> int:
    """Store each (partition, epoch, base sequence, values) batch of one producer id, waiting
    after each until the broker has forgotten the producer; returns the producer id."""
    admin = Admin({"bootstrap.servers": bootstrap})
    try:
        pid = init_producer_id(admin.conn)
        for partition, epoch, seq, values in batches:
            calls.produce(admin.conn, topic, partition, batch(pid, epoch, seq, values))
            deadline = time.monotonic() + TIMEOUT
            while admin.describe_producers(topic, [partition])[partition]:
                assert time.monotonic() < deadline, "the broker never forgot the producer"
                time.sleep(0.05)
    finally:
        admin.close()
    return pid
