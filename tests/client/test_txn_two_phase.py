"""Two-phase commit with an external coordinator (KIP-939), end to end: oncelog's producer
prepares a transaction, its process "dies", the next instance with the transactional id
finds the prepared transaction (InitProducerId v6 keep_prepared_txn) and commits it."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as CTopicPartition
from kio.schema.errors import ErrorCode
from support.brokers import BrokerProcess, create_topic

import oncelog


def committed_values(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    """What a read_committed reader gets: polled until ``expected`` records came, then for
    a moment longer to see that nothing more does."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        consumer.assign([CTopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        quiet_until = None
        while time.monotonic() < deadline:
            if len(values) >= expected:
                quiet_until = quiet_until or time.monotonic() + 1.0
                if time.monotonic() > quiet_until:
                    break
            m = consumer.poll(0.1)
            if m is not None and m.error() is None:
                values.append(m.value())
        return values
    finally:
        consumer.close()


def test_a_prepared_transaction_is_committed_by_the_next_instance(tmp_path):
    broker = BrokerProcess(tmp_path / "data", {"transaction.two.phase.commit.enable": "true"})
    broker.start()
    try:
        create_topic(broker.bootstrap, "2pc", 1)
        config = {"bootstrap.servers": broker.bootstrap, "transactional.id": "external",
                  "transaction.two.phase.commit.enable": True}
        first = oncelog.Producer(config)
        first.init_transactions(30)
        first.begin_transaction()
        for i in range(5):
            first.produce("2pc", value=f"v{i}".encode(), partition=0)
        prepared = str(first.prepare_transaction(30))
        # The external coordinator records ``prepared``; this process is gone from here on.
        assert committed_values(broker.bootstrap, "2pc", 0) == []
        second = oncelog.Producer(config)
        second.init_transactions(30, keep_prepared_txn=True)
        second.complete_transaction(prepared, 30)
        second.close(10)
        assert committed_values(broker.bootstrap, "2pc", 5) == [f"v{i}".encode() for i in range(5)]
    finally:
        broker.kill()


def test_two_phase_commit_is_refused_unless_the_broker_allows_it(tmp_path):
    broker = BrokerProcess(tmp_path / "data",
                           {"transaction.two.phase.commit.enable": "false"}).start()
    try:
        producer = oncelog.Producer({"bootstrap.servers": broker.bootstrap,
                                     "transactional.id": "external",
                                     "transaction.two.phase.commit.enable": True})
        with pytest.raises(oncelog.KafkaError) as failure:
            producer.init_transactions(30)
        assert "AUTHORIZATION" in str(failure.value).upper()
    finally:
        broker.kill()


def test_an_admin_ends_prepared_transactions_without_a_producer_each(tmp_path):
    """What the Spark sink's driver does with its tasks' prepared transactions: EndTxn with
    each one's prepared producer id and epoch, pipelined through one admin connection; a
    transaction whose epoch moved on (another instance kept it) refuses that EndTxn and is
    committed at its new epoch; InitProducerId as a new instance aborts one."""
    broker = BrokerProcess(tmp_path / "data", {"transaction.two.phase.commit.enable": "true"})
    broker.start()
    try:
        create_topic(broker.bootstrap, "2pc", 1)
        prepared = {}
        for name in ("commit-a", "commit-b", "kept", "aborted"):
            producer = oncelog.Producer({"bootstrap.servers": broker.bootstrap,
                                         "transactional.id": name,
                                         "transaction.two.phase.commit.enable": True})
            producer.init_transactions(30)
            producer.begin_transaction()
            for i in range(3):
                producer.produce("2pc", value=f"{name}-{i}".encode(), partition=0)
            state = producer.prepare_transaction(30)
            prepared[name] = (state.producer_id, state.epoch)
            producer.close(10)
        with oncelog.Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            kept = admin.fence_transactions(["kept"], keep_prepared=True)["kept"]
            assert (kept.ongoing_producer_id, kept.ongoing_epoch) == prepared["kept"]
            assert kept.epoch > prepared["kept"][1]
            answers = admin.end_transactions(
                {n: prepared[n] for n in ("commit-a", "commit-b", "kept")}, commit=True)
            assert answers == {"commit-a": ErrorCode.none, "commit-b": ErrorCode.none,
                               "kept": ErrorCode.producer_fenced}
            assert admin.end_transactions({"kept": (kept.producer_id, kept.epoch)}, True) \
                == {"kept": ErrorCode.none}
            assert admin.fence_transactions(["aborted"])["aborted"].ongoing_producer_id == -1
            assert {t.transactional_id for ts in admin.list_transactions(
                states=("Ongoing",)).values() for t in ts} == set()
        assert sorted(committed_values(broker.bootstrap, "2pc", 9)) == sorted(
            f"{name}-{i}".encode() for name in ("commit-a", "commit-b", "kept")
            for i in range(3))
    finally:
        broker.kill()
