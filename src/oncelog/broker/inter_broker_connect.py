"""How this broker opens a connection to another broker of its cluster (a follower fetching
from its leader): on the inter-broker listener, Kafka's ``inter.broker.listener.name`` (or the
listener named as ``security.inter.broker.protocol``), at the other broker's registered
endpoint of that listener, with that listener's security:

| inter-broker listener's protocol | the connection                                          |
|----------------------------------|---------------------------------------------------------|
| PLAINTEXT                        | TCP                                                     |
| SSL                              | TLS: the listener's truststore checks the other broker, |
|                                  | the listener's keystore is this broker's certificate;   |
|                                  | then ApiVersions (TLS 1.3 refuses a certificate then)   |
| SASL_PLAINTEXT                   | TCP, then SASL                                          |
| SASL_SSL                         | TLS as SSL, then SASL                                   |

SASL is ``sasl.mechanism.inter.broker.protocol`` (enabled on that listener) with the
``username`` and ``password`` of ``listener.name.<listener>.<mechanism>.sasl.jaas.config``, as
Kafka's brokers take them; the steps are security/sasl_client.py's, the clients' own. Every
setting is read and checked when the broker starts (ConfigError), never at the first fetch.
The other broker authorizes what comes next (the replication Fetch needs ClusterAction) for
the principal authenticated here. With a session lifetime (its ``connections.max.reauth.ms``),
the connection re-authenticates before it ends as oncelog's clients do
(security/sasl_reauth_client.py, driven by inter_broker.py's BrokerConnection).
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import struct
from dataclasses import dataclass

from ..protocol import api_versions as apis
from ..protocol.messages import decode_response, encode_request
from ..protocol.schema import build, request_module
from ..security import sasl_client
from ..security.sasl_reauth_client import Reauthentication
from ..security.sasl_server import SUPPORTED_MECHANISMS
from .config import BrokerConfig, ConfigError
from .listener_security import client_context
from .listeners import SASL_PROTOCOLS, TLS_PROTOCOLS
from .log_limits import RateLimitedLog

log = logging.getLogger(__name__)
_refused = RateLimitedLog(log)  # a follower retries every replica.fetch.backoff.ms

CONNECT_TIMEOUT_S = 10.0  # TCP and TLS
AUTHENTICATE_TIMEOUT_S = 30.0  # the SASL exchange, answers delayed after a failure included
SASL_VERSIONS = {apis.SASL_HANDSHAKE: 1, apis.SASL_AUTHENTICATE: 1}  # v1: the lifetime told
_SIZE = struct.Struct(">i")
_MAX_FRAME = 1 << 20  # a SASL or ApiVersions answer; anything larger is not one
_JAAS_VALUE = r'\b{}\s*=\s*"([^"]*)"'


class InterBrokerConnectFailed(ConnectionError):
    """The other broker cannot be reached on the inter-broker listener, or refused us."""


@dataclass(frozen=True)
class InterBrokerSecurity:
    listener: str
    protocol: str
    ssl_context: ssl.SSLContext | None
    mechanism: str | None = None
    username: str = ""
    password: str = ""


def inter_broker_security(config: BrokerConfig) -> InterBrokerSecurity:
    """The inter-broker listener's client side, checked; ConfigError naming the key."""
    name = config.inter_broker_listener_name
    endpoint = next((e for e in config.listeners if e.name == name), None)
    if endpoint is None:
        raise ConfigError(f"inter.broker.listener.name: {name} is not in listeners")
    protocol = endpoint.security_protocol
    context = client_context(config, name) if protocol in TLS_PROTOCOLS else None
    if protocol not in SASL_PROTOCOLS:
        return InterBrokerSecurity(name, protocol, context)
    mechanism = str(config.get("sasl.mechanism.inter.broker.protocol")).strip().upper()
    enabled = config.listener_setting(name, "sasl.enabled.mechanisms").split(",")
    if mechanism not in SUPPORTED_MECHANISMS or mechanism not in enabled:
        raise ConfigError(
            f"sasl.mechanism.inter.broker.protocol: {mechanism} must be included in "
            f"sasl.enabled.mechanisms of listener {name} ({', '.join(enabled)}) when SASL is "
            f"used for inter-broker communication; available: {', '.join(SUPPORTED_MECHANISMS)}")
    key = f"listener.name.{name.lower()}.{mechanism.lower()}.sasl.jaas.config"
    jaas = config.listener_overrides.get(key) or ""
    found = {field: re.search(_JAAS_VALUE.format(field), jaas) for field in ("username",
                                                                             "password")}
    if not all(found.values()):
        raise ConfigError(f"{key}: the inter-broker listener {name} authenticates with "
                          f"{mechanism} and needs username=\"...\" password=\"...\" there")
    return InterBrokerSecurity(name, protocol, context, mechanism,
                               found["username"].group(1), found["password"].group(1))


def endpoint_of(broker, broker_id: int, listener: str) -> tuple[str, int]:
    """Where ``broker_id`` registered ``listener``; InterBrokerConnectFailed when it is not
    registered or has no such listener (Kafka: BrokerEndPointNotAvailableException)."""
    for registration in broker.cluster.brokers:
        if registration.broker_id != broker_id:
            continue
        for name, host, port, _protocol in registration.endpoints:
            if name == listener:
                return host, port
        if not registration.endpoints and listener == "PLAINTEXT":
            return registration.host, registration.port
        raise InterBrokerConnectFailed(f"broker {broker_id} has no listener {listener}")
    raise InterBrokerConnectFailed(f"broker {broker_id} is not registered")


async def open_connection(broker, broker_id: int
                          ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                     Reauthentication | None]:
    """A connection to ``broker_id`` on the inter-broker listener, secured and authenticated
    as that listener asks, and its SASL session to re-authenticate (None without SASL);
    InterBrokerConnectFailed (an OSError) or TimeoutError when it cannot be, with a
    (rate-limited) warning saying why when a certificate or credentials were refused."""
    security: InterBrokerSecurity = broker.inter_broker_security
    host, port = endpoint_of(broker, broker_id, security.listener)
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):  # not wait_for: it can swallow a cancel
            reader, writer = await asyncio.open_connection(
                host, port, ssl=security.ssl_context,
                server_hostname=host if security.ssl_context is not None else None)
    except ssl.SSLError as exc:  # a certificate refused, one way or the other: say which
        _refused.log(logging.WARNING, f"TLS with broker {broker_id}",
                     "TLS with broker %d at %s:%d on listener %s failed: %s", broker_id, host,
                     port, security.listener, exc)
        raise InterBrokerConnectFailed(f"TLS with broker {broker_id} failed: {exc}") from None
    client_id = f"broker-{broker.broker_id}"
    reauth = None
    try:
        async with asyncio.timeout(AUTHENTICATE_TIMEOUT_S):
            if security.mechanism is not None:
                reauth = Reauthentication(security.mechanism, security.username,
                                          security.password)
                await _authenticate(reader, writer, reauth, client_id)
            elif security.ssl_context is not None:
                # TLS 1.3 asks for our certificate after the handshake is done on our side: a
                # broker refusing it closes the connection now, said here, not at the fetch
                await _call(reader, writer, client_id, 1, apis.API_VERSIONS_KEY, 0,
                            lambda mod, _v: build(mod.ApiVersionsRequest))
    except sasl_client.SaslRefused as exc:
        writer.close()
        _refused.log(logging.WARNING, f"authentication to broker {broker_id}",
                     "authenticating to broker %d on listener %s as User:%s with %s failed: "
                     "%s (%s)", broker_id, security.listener, security.username,
                     security.mechanism, exc, exc.error.name.upper())
        raise InterBrokerConnectFailed(f"broker {broker_id} refused our authentication: "
                                       f"{exc}") from None
    except InterBrokerConnectFailed:
        writer.close()
        raise
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError) as exc:
        writer.close()
        # Kafka's brokers close without an answer a client whose certificate they refuse
        # (and oncelog's one failing SASL after SaslHandshake v0)
        _refused.log(logging.WARNING, f"TLS with broker {broker_id}",
                     "broker %d at %s:%d closed the connection on listener %s before it was "
                     "set up (our certificate or credentials refused?): %r", broker_id, host,
                     port, security.listener, exc)
        raise InterBrokerConnectFailed(f"broker {broker_id} closed the connection before it "
                                       f"was set up") from None
    except BaseException:
        writer.close()
        raise
    return reader, writer, reauth


async def _authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        reauth: Reauthentication, client_id: str) -> None:
    correlation = 0

    async def step(api_key: int, make):
        nonlocal correlation
        correlation += 1
        return await _call(reader, writer, client_id, correlation, api_key,
                           SASL_VERSIONS[api_key], make)

    await reauth.authenticate_async(step)


async def _call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str,
                correlation: int, api_key: int, version: int, make):
    """One request of the connection's setup, and its answer."""
    writer.write(encode_request(api_key, version, correlation, client_id,
                                make(request_module(api_key, version), version)))
    await writer.drain()
    (size,) = _SIZE.unpack(await reader.readexactly(4))
    if not 4 <= size <= _MAX_FRAME:
        raise InterBrokerConnectFailed(f"an answer of {size} bytes while setting up")
    frame = await reader.readexactly(size)
    try:
        answered, answer = decode_response(api_key, version, frame)
    except Exception as exc:  # a value kio cannot hold (a lifetime of 2**62 ms), ...
        raise InterBrokerConnectFailed(f"an answer that does not decode while setting up: "
                                       f"{exc!r}") from None
    if answered != correlation:
        raise InterBrokerConnectFailed(f"correlation id {answered} answered {correlation}")
    return answer
