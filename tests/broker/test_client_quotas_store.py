"""broker/client_quotas.py on a real LocalFileStore: what AlterClientQuotas writes is found
again by a broker started later (the store's files, at Kafka's paths with Kafka's JSON),
names needing Kafka's sanitizing included, and an entity goes with its last key."""

from __future__ import annotations

import asyncio

from oncelog.broker.client_quotas import ClientQuotas
from oncelog.broker.config import BrokerConfig
from oncelog.metadata.store import LocalFileStore


def test_quotas_survive_a_restart(tmp_path):
    store = LocalFileStore(str(tmp_path))
    quotas = ClientQuotas(BrokerConfig(), store)
    assert not quotas.active
    results = asyncio.run(quotas.alter([
        ("a", [("user", "a b*"), ("client-id", None)], [("producer_byte_rate", 1024, False)]),
        ("b", [("client-id", "<default>")], [("consumer_byte_rate", 2048, False)]),
        ("c", [("user", None)], [("request_percentage", 5.5, False)]),
        ("d", [("ip", "10.0.0.1")], [("connection_creation_rate", 3, False)]),
    ], validate_only=False))
    assert [error for _, error, _ in results] == [None] * 4
    assert quotas.active and quotas.time_measured
    assert store.get("config/users/a%20b%2A/clients/<default>")[0] == {
        "version": 1, "config": {"producer_byte_rate": "1024"}}
    assert store.get("config/clients/%3Cdefault%3E")[0] == {
        "version": 1, "config": {"consumer_byte_rate": "2048"}}
    again = ClientQuotas(BrokerConfig(), store)
    assert again.entities == quotas.entities == {
        (("client-id", None), ("user", "a b*")): {"producer_byte_rate": 1024.0},
        (("client-id", "<default>"),): {"consumer_byte_rate": 2048.0},
        (("user", None),): {"request_percentage": 5.5},
        (("ip", "10.0.0.1"),): {"connection_creation_rate": 3.0},
    }
    asyncio.run(again.alter([("c", [("user", None)], [("request_percentage", 0, True)])],
                            False))
    assert store.get("config/users/<default>") == (None, -1)
    assert not ClientQuotas(BrokerConfig(), store).time_measured


def test_more_than_ten_thousand_alterations_are_all_refused(tmp_path):
    """Kafka's bound on one operation's records: nothing of such a request is written."""
    store = LocalFileStore(str(tmp_path))
    quotas = ClientQuotas(BrokerConfig(), store)
    many = [(i, [("client-id", f"c{i}")], [("producer_byte_rate", 1.0, False)])
            for i in range(10_001)]
    results = asyncio.run(quotas.alter(many, validate_only=False))
    assert {error for _, error, _ in results} == {"UNKNOWN_SERVER_ERROR"}
    assert store.children("config/clients") == [] and not quotas.active


def test_made_up_client_ids_cost_bounded_memory(tmp_path, monkeypatch):
    """Under a clients/<default> quota every client id has its own rate: at most MAX_RATES
    of them are kept, the oldest forgotten first."""
    from oncelog.broker import client_quotas
    from oncelog.protocol.messages import Request

    monkeypatch.setattr(client_quotas, "MAX_RATES", 50)
    quotas = ClientQuotas(BrokerConfig(), LocalFileStore(str(tmp_path)))
    asyncio.run(quotas.alter([(0, [("client-id", None)], [("producer_byte_rate", 1e6, False)])],
                             validate_only=False))
    for i in range(500):
        quotas.before(Request(0, 9, i, f"made-up-{i}", None, 100))
    assert len(quotas._rates) == 50
    assert ("producer_byte_rate", "", "made-up-499") in quotas._rates
