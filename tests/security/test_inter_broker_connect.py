"""broker/inter_broker_connect.open_connection row by row against the session's secured broker
(SASL_SSL with SCRAM, SSL with mutual TLS required, PLAINTEXT): the client side each broker
builds from its own configuration (``inter_broker_security``) reaches another's registered
endpoint of the inter-broker listener, authenticated, or fails with InterBrokerConnectFailed
and a log line saying why. The broker being connected to is real; what stands in for the
connecting broker is only its configuration and the registrations it read from ZooKeeper.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from types import SimpleNamespace

import pytest
from support.secured import USERS

from oncelog.broker.config import BrokerConfig
from oncelog.broker.inter_broker_connect import (
    InterBrokerConnectFailed,
    inter_broker_security,
    open_connection,
)
from oncelog.cluster.znodes import BrokerRegistration
from oncelog.protocol import api_versions as apis
from oncelog.protocol.messages import decode_response, encode_request
from oncelog.protocol.schema import build, request_module

TIMEOUT = 20.0


def _connecting(secured, settings: dict[str, str]):
    """A broker (id 9) configured with ``settings``, that read broker 1's registration: the
    secured broker's listeners."""
    registration = BrokerRegistration(1, "127.0.0.1", secured.broker.port, None, tuple(
        (name, "127.0.0.1", port, name) for name, port in secured.broker.ports.items()))
    return SimpleNamespace(broker_id=9, inter_broker_security=inter_broker_security(BrokerConfig({
        "ssl.truststore.location": str(secured.ca.pem), **settings})),
        cluster=SimpleNamespace(brokers=(registration,)))


def _sasl_ssl(secured, password: str) -> dict[str, str]:
    return {"listeners": "SASL_SSL://127.0.0.1:0",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "ssl.keystore.location": str(secured.client.both),
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                'org.apache.kafka.common.security.scram.ScramLoginModule required '
                f'username="alice" password="{password}";'}


def _ssl(keystore) -> dict[str, str]:
    return {"listeners": "SSL://127.0.0.1:0", "security.inter.broker.protocol": "SSL",
            "ssl.keystore.location": str(keystore.both)}


async def _metadata(broker) -> int:
    """Open a connection to broker 1 and ask it Metadata: how many brokers it names."""
    reader, writer, _session = await open_connection(broker, 1)
    try:
        mod = request_module(apis.METADATA, 9)
        writer.write(encode_request(apis.METADATA, 9, 1, "replica-9", build(
            mod.MetadataRequest, topics=(), allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
            include_cluster_authorized_operations=False)))
        async with asyncio.timeout(TIMEOUT):
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            _, answer = decode_response(apis.METADATA, 9, await reader.readexactly(size))
        return len(answer.brokers)
    finally:
        writer.close()


def test_sasl_ssl_authenticated_with_the_listeners_jaas_credentials(secured):
    assert asyncio.run(_metadata(_connecting(secured, _sasl_ssl(secured, USERS["alice"])))) == 1


def test_a_wrong_password_is_refused_and_said(secured, caplog):
    broker = _connecting(secured, _sasl_ssl(secured, "not-alices"))
    with caplog.at_level(logging.WARNING), pytest.raises(InterBrokerConnectFailed,
                                                          match="refused our authentication"):
        asyncio.run(_metadata(broker))
    assert "SASL_AUTHENTICATION_FAILED" in caplog.text


def test_mutual_tls_with_the_listeners_keystore(secured):
    assert asyncio.run(_metadata(_connecting(secured, _ssl(secured.client)))) == 1


def test_a_certificate_the_other_does_not_trust_is_said(secured, caplog):
    broker = _connecting(secured, _ssl(secured.stranger))
    with caplog.at_level(logging.WARNING), pytest.raises(
            InterBrokerConnectFailed, match="closed the connection before it was set up"):
        asyncio.run(_metadata(broker))
    assert "our certificate or credentials refused" in caplog.text


def test_a_broker_without_the_listener(secured):
    broker = _connecting(secured, {"listeners": "INTERNAL://127.0.0.1:0",
                                   "listener.security.protocol.map": "INTERNAL:PLAINTEXT",
                                   "inter.broker.listener.name": "INTERNAL"})
    with pytest.raises(InterBrokerConnectFailed, match="broker 1 has no listener INTERNAL"):
        asyncio.run(_metadata(broker))
