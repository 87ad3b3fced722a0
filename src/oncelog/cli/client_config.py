"""``--command-config FILE``, as Kafka's tools take it: a .properties file of client settings
(security above all) for every connection a command opens.

Both spellings are read: librdkafka's (``security.protocol``, ``sasl.mechanism``,
``sasl.username``, ``sasl.password``, ``ssl.ca.location``, ``ssl.certificate.location``,
``ssl.key.location``, ...: oncelog's clients take these) and the Java client's that a Kafka
user's file already holds, turned into them: ``sasl.jaas.config``'s ``username="..."`` and
``password="..."``, ``ssl.truststore.location`` (PEM) as ``ssl.ca.location``, and
``ssl.keystore.location`` (PEM: certificate and key) as both certificate and key.
"""

from __future__ import annotations

import argparse
import re

from ..broker.config import parse_properties
from ..client.network.security import SECURITY_KEYS, ClientSecurity

_JAAS_FIELD = re.compile(r'\b(username|password)\s*=\s*"([^"]*)"')
_JAVA_ONLY = {"ssl.truststore.type", "ssl.keystore.type", "ssl.truststore.password",
              "ssl.keystore.password", "sasl.jaas.config", "ssl.truststore.location",
              "ssl.keystore.location"}


def read_command_config(path: str | None) -> dict[str, str]:
    """The client settings of ``path`` (none without one); SystemExit naming the file when it
    cannot be read or holds a key no client of ours takes."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            props = parse_properties(f.read())
    except OSError as exc:
        raise SystemExit(f"oncelog: --command-config {path}: {exc.strerror or exc}") from None
    settings = {k: v for k, v in props.items() if k in SECURITY_KEYS or k == "client.id"}
    jaas = props.get("sasl.jaas.config", "")
    for field, value in _JAAS_FIELD.findall(jaas):
        settings.setdefault(f"sasl.{field}", value)
    if "ssl.truststore.location" in props:
        settings.setdefault("ssl.ca.location", props["ssl.truststore.location"])
    if "ssl.keystore.location" in props:
        settings.setdefault("ssl.certificate.location", props["ssl.keystore.location"])
        settings.setdefault("ssl.key.location", props["ssl.keystore.location"])
    if "ssl.key.password" in props:
        settings.setdefault("ssl.key.password", props["ssl.key.password"])
    unknown = sorted(set(props) - set(settings) - _JAVA_ONLY)
    if unknown:
        raise SystemExit(f"oncelog: --command-config {path}: unknown client settings "
                         f"{', '.join(unknown)}")
    try:  # a missing file or a bad value: said here once, for every command
        ClientSecurity.from_config(settings)
    except ValueError as exc:
        raise SystemExit(f"oncelog: --command-config {path}: {exc}") from None
    return settings


def client_config(args: argparse.Namespace, **extra: str) -> dict[str, str]:
    """The settings a command's client is made with: ``--bootstrap-server``, then
    ``--command-config``'s, then the command's own."""
    return {"bootstrap.servers": args.bootstrap_server,
            **read_command_config(getattr(args, "command_config", None)), **extra}
