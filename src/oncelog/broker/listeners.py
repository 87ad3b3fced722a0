"""``listeners``, ``advertised.listeners`` and ``listener.security.protocol.map`` as Kafka reads
them: each listener is ``NAME://host:port``; its name maps to one of Kafka's security
protocols (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL; a name that is a protocol maps to itself
by default); an empty host binds every interface; port 0 picks a free port. A listener not in
``advertised.listeners`` advertises where it is bound. Settings may be given for one listener
as Kafka's ``listener.name.<name lowercased>.<key>`` (``BrokerConfig.listener_setting``).

No I/O here and no config classes: config.py turns a ValueError into its ConfigError.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
_ENDPOINT = re.compile(r"(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)://)?\[?(?P<host>[^\]\s/]*)\]?"
                       r":(?P<port>\d{1,5})")


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str  # the listener's name, upper case (Kafka's ListenerName)
    host: str
    port: int
    security_protocol: str

    @property
    def sasl(self) -> bool:
        return self.security_protocol in SASL_PROTOCOLS

    @property
    def tls(self) -> bool:
        return self.security_protocol in TLS_PROTOCOLS


def parse_protocol_map(text: str) -> dict[str, str]:
    """``NAME:PROTOCOL,...`` -> {NAME: PROTOCOL}."""
    found: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name or protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"expected NAME:PROTOCOL pairs with PROTOCOL one of "
                             f"{', '.join(SECURITY_PROTOCOLS)}, got {item!r}")
        if name in found:
            raise ValueError(f"listener {name} is mapped twice")
        found[name] = protocol
    return found


def parse_listeners(text: str, protocols: Mapping[str, str]) -> list[Endpoint]:
    """Every listener of ``text``; ValueError when one is malformed, unnamed in the map, or
    named twice. Without a scheme a listener is PLAINTEXT (oncelog's older form)."""
    endpoints: list[Endpoint] = []
    for item in (i.strip() for i in text.split(",")):
        match = _ENDPOINT.fullmatch(item)
        if not match or int(match.group("port")) > 65535:
            raise ValueError(f"expected PLAINTEXT://host:port or another NAME://host:port, "
                             f"got {item!r}")
        name = (match.group("name") or "PLAINTEXT").upper()
        protocol = protocols.get(name)
        if protocol is None:
            raise ValueError(f"listener {name} is not in listener.security.protocol.map "
                             f"({', '.join(protocols)})")
        if any(e.name == name for e in endpoints):
            raise ValueError(f"listener {name} is named twice")
        endpoints.append(Endpoint(name, match.group("host") or "0.0.0.0",
                                  int(match.group("port")), protocol))
    ports = [e.port for e in endpoints if e.port]
    if len(set(ports)) != len(ports):
        raise ValueError(f"two listeners on one port in {text!r}")
    return endpoints


def listener_override(name: str) -> tuple[str, str] | None:
    """(listener, key) of a ``listener.name.<listener>.<key>`` config name, else None."""
    match = re.fullmatch(r"listener\.name\.([a-z_][a-z0-9_]*)\.(.+)", name)
    return (match.group(1), match.group(2)) if match else None


def inter_broker_listener(listener_name: str | None, protocol: str | None,
                          advertised: list[str], required: bool) -> str:
    """The listener brokers reach each other on, by Kafka's rules: ``inter.broker.listener.name``
    or ``security.inter.broker.protocol`` (the listener named as the protocol; PLAINTEXT when
    neither is set), never both; it must be one of the advertised listeners. ``required``:
    checked only when set or in cluster mode (one broker alone reaches no other)."""
    if listener_name is not None and protocol is not None:
        raise ValueError("Only one of inter.broker.listener.name and "
                         "security.inter.broker.protocol should be set.")
    key = "inter.broker.listener.name" if listener_name is not None \
        else "security.inter.broker.protocol"
    name = (listener_name or protocol or "PLAINTEXT").strip().upper()
    if (required or listener_name is not None or protocol is not None) \
            and name not in advertised:
        raise ValueError(f"{key}: {name} must be a listener name defined in "
                         f"advertised.listeners. The valid options based on currently "
                         f"configured listeners are {','.join(advertised)}")
    return name
