"""The admin client's DescribeClientQuotas and AlterClientQuotas (what kafka-configs.sh sends
for ``--entity-type users | clients | ips``), over any connection to any Kafka broker.

An entity is a mapping of entity type (``user``, ``client-id``, ``ip``) to its name, None for
the default; a change is a mapping of quota key to its new value, None to remove it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.schema import build
from ..network.connection import BrokerConnection, KafkaError

MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2

Entity = Mapping[str, "str | None"]


def alter_client_quotas(conn: BrokerConnection,
                        changes: Iterable[tuple[Entity, Mapping[str, float | None]]],
                        validate_only: bool = False) -> list[KafkaError | None]:
    """One result per change, in order: None where it was done (or would be)."""
    changes = list(changes)

    def make(mod, version):
        return build(mod.AlterClientQuotasRequest, validate_only=validate_only, entries=tuple(
            build(mod.EntryData,
                  entity=tuple(build(mod.EntityData, entity_type=kind, entity_name=name)
                               for kind, name in entity.items()),
                  ops=tuple(build(mod.OpData, key=key, value=float(value or 0.0),
                                  remove=value is None) for key, value in ops.items()))
            for entity, ops in changes))

    response = conn.call(apis.ALTER_CLIENT_QUOTAS, make)
    return [None if entry.error_code == ErrorCode.none
            else KafkaError(entry.error_code, entry.error_message or "")
            for entry in response.entries]


def describe_client_quotas(conn: BrokerConnection,
                           components: Iterable[tuple[str, int, str | None]] = (),
                           strict: bool = False) -> list[tuple[dict[str, str | None],
                                                               dict[str, float]]]:
    """(entity, quota values) of every entity the filter matches: components of (entity
    type, MATCH_*, name or None)."""
    components = list(components)

    def make(mod, version):
        return build(mod.DescribeClientQuotasRequest, strict=strict, components=tuple(
            build(mod.ComponentData, entity_type=kind, match_type=match_type, match=match)
            for kind, match_type, match in components))

    response = conn.call(apis.DESCRIBE_CLIENT_QUOTAS, make)
    if response.error_code != ErrorCode.none:
        raise KafkaError(response.error_code, response.error_message or "")
    return [({e.entity_type: e.entity_name for e in entry.entity},
             {v.key: v.value for v in entry.values}) for entry in response.entries or ()]
