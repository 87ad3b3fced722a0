"""What AlterClientQuotas may set and what DescribeClientQuotas matches, sans-IO: Kafka's
rules (its ClientQuotaControlManager and ClientQuotasImage), each refusal a ``QuotaError``
carrying Kafka's error name and message.

An alteration, entry by entry (each entry answered on its own):

    | # | the entry                                          | answer                       |
    |---|----------------------------------------------------|------------------------------|
    | 1 | no entity parts                                    | INVALID_REQUEST              |
    | 2 | an entity type named twice                         | INVALID_REQUEST              |
    | 3 | an entity type other than user, client-id, ip      | INVALID_REQUEST              |
    | 4 | an empty name ("" is not the default, None is)     | INVALID_REQUEST              |
    | 5 | ip together with user or client-id                 | INVALID_REQUEST              |
    | 6 | ip that is not an IP address                       | INVALID_REQUEST              |
    | 7 | a key named twice                                  | INVALID_REQUEST              |
    | 8 | the same entity as an earlier entry                | INVALID_REQUEST              |
    | 9 | a key the entity cannot have (set, not removed)    | INVALID_REQUEST              |
    |10 | a value <= 0                                       | INVALID_REQUEST              |
    |11 | a fractional or too large value for an integral key| INVALID_REQUEST              |
    |12 | otherwise                                          | NONE: set / removed (removing|
    |   |                                                    | an unset key is no change)   |

The keys: a user and/or client-id entity has ``producer_byte_rate``, ``consumer_byte_rate``
(LONG), ``request_percentage`` and ``controller_mutation_rate`` (DOUBLE); an ip entity has
``connection_creation_rate`` (INT).

A describe filter: components of (entity type, match type: 0 exact name, 1 the default, 2
any name given), ``strict`` keeping only entities with no other parts. An empty or repeated
type, a match string where none belongs or none where one does, or an unknown match type is
INVALID_REQUEST; an unknown entity type is UNSUPPORTED_VERSION; ip with user or client-id
is INVALID_REQUEST. The whole answer carries the error (no entries).
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Iterable, Mapping

from .quotas import (
    CLIENT_ID,
    CONNECTION_CREATION_RATE,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    IP,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    USER,
    Entity,
)

INVALID_REQUEST = "INVALID_REQUEST"
UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
DEFAULT_NAME = "<default>"  # the default entity's name in paths (ZooKeeper's)

_LONG, _INT, _DOUBLE = "LONG", "INT", "DOUBLE"
CLIENT_QUOTA_KEYS = {PRODUCER_BYTE_RATE: _LONG, CONSUMER_BYTE_RATE: _LONG,
                     REQUEST_PERCENTAGE: _DOUBLE, CONTROLLER_MUTATION_RATE: _DOUBLE}
IP_QUOTA_KEYS = {CONNECTION_CREATION_RATE: _INT}
_TYPE_MAX = {_LONG: float((1 << 63) - 1), _INT: float((1 << 31) - 1)}
ENTITY_TYPES = (USER, CLIENT_ID, IP)


class QuotaError(Exception):
    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


def validate_entity(parts: Iterable[tuple[str, str | None]]) -> Entity:
    """The entity an alteration names (rows 1-6), its parts sorted by type."""
    seen: dict[str, str | None] = {}
    for kind, name in parts:
        if kind in seen:
            raise QuotaError(INVALID_REQUEST,
                             f"Invalid client quota entity, duplicate entity entry {kind}")
        if kind not in ENTITY_TYPES:
            raise QuotaError(INVALID_REQUEST, f"Unhandled client quota entity type: {kind}")
        if name is not None and not name:
            raise QuotaError(INVALID_REQUEST, f"Empty {kind} not supported")
        seen[kind] = name
    if not seen:
        raise QuotaError(INVALID_REQUEST, "Invalid empty client quota entity")
    if IP in seen:
        if len(seen) > 1:
            raise QuotaError(INVALID_REQUEST, "Invalid quota entity combination, IP entity "
                             "should not be combined with User or ClientId")
        if seen[IP] is not None and not _is_ip(seen[IP]):
            raise QuotaError(INVALID_REQUEST, f"{seen[IP]} is not a valid IP or resolvable host.")
    return tuple(sorted(seen.items()))


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def keys_of(entity: Entity) -> Mapping[str, str]:
    """The keys an entity may have, and their Kafka types."""
    return IP_QUOTA_KEYS if entity and entity[0][0] == IP else CLIENT_QUOTA_KEYS


def validate_ops(entity: Entity, ops: Iterable[tuple[str, float, bool]]
                 ) -> dict[str, float | None]:
    """key -> new value (None: remove) for (key, value, remove) ops (rows 7, 9-11)."""
    changes: dict[str, float | None] = {}
    keys = keys_of(entity)
    for key, value, remove in ops:
        if key in changes:
            raise QuotaError(INVALID_REQUEST, f"Duplicate quota key {key} not updating quota "
                             f"for this entity")
        changes[key] = None if remove else float(value)
    for key, value in changes.items():
        if value is None:
            continue
        kind = keys.get(key)
        if kind is None:
            raise QuotaError(INVALID_REQUEST, f"Invalid configuration key {key}")
        if not value > 0.0:  # NaN too
            raise QuotaError(INVALID_REQUEST, f"Quota {key} must be greater than 0")
        if kind in _TYPE_MAX:
            if value > _TYPE_MAX[kind]:
                raise QuotaError(INVALID_REQUEST, f"Proposed value for {key} is too large for "
                                 f"{'a LONG' if kind == _LONG else 'an INT'}.")
            if abs(value % 1.0) > 1e-6:
                raise QuotaError(INVALID_REQUEST, f"{key} cannot be a fractional value.")
    return changes


def applied(current: Mapping[str, float], changes: Mapping[str, float | None]
            ) -> dict[str, float]:
    """An entity's keys after ``changes`` (row 12)."""
    result = dict(current)
    for key, value in changes.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = value
    return result


Filter = tuple[dict[str, "str | None"], set[str], bool]  # exact names, types given, strict


def parse_filter(components: Iterable[tuple[str, int, str | None]], strict: bool) -> Filter:
    exact: dict[str, str | None] = {}
    typed: set[str] = set()
    for kind, match_type, match in components:
        if not kind:
            raise QuotaError(INVALID_REQUEST, "Invalid empty entity type.")
        if kind in exact or kind in typed:
            raise QuotaError(INVALID_REQUEST,
                             f"Entity type {kind} cannot appear more than once in the filter.")
        if kind not in ENTITY_TYPES:
            raise QuotaError(UNSUPPORTED_VERSION, f"Unsupported entity type {kind}")
        if match_type == MATCH_EXACT:
            if match is None:
                raise QuotaError(INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT, but set "
                                 "match string to null.")
            exact[kind] = match
        elif match_type == MATCH_DEFAULT:
            if match is not None:
                raise QuotaError(INVALID_REQUEST, "Request specified MATCH_TYPE_DEFAULT, but "
                                 "also specified a match string.")
            exact[kind] = None
        elif match_type == MATCH_SPECIFIED:
            if match is not None:
                raise QuotaError(INVALID_REQUEST, "Request specified MATCH_TYPE_SPECIFIED, but "
                                 "also specified a match string.")
            typed.add(kind)
        else:
            raise QuotaError(INVALID_REQUEST, f"Unknown match type {match_type}")
    named = exact.keys() | typed
    if IP in named and named & {USER, CLIENT_ID}:
        raise QuotaError(INVALID_REQUEST, "Invalid entity filter component combination. IP "
                         "filter component should not be used with user or clientId filter "
                         "component.")
    return exact, typed, strict


def matches(entity: Entity, filter_: Filter) -> bool:
    exact, typed, strict = filter_
    parts = dict(entity)
    if strict and len(parts) != len(exact) + len(typed):
        return False
    return all(kind in parts and parts[kind] == name for kind, name in exact.items()) and \
        all(kind in parts for kind in typed)


# --- where an entity is kept: Kafka's ZooKeeper paths ---------------------------------------

def sanitize(name: str | None) -> str:
    """Kafka's Sanitizer on a name in a path (URL encoding, "*" and " " percent-encoded); the
    default is ``<default>``."""
    if name is None:
        return DEFAULT_NAME
    return urllib.parse.quote(name, safe="").replace("~", "%7E")


def desanitize(text: str) -> str | None:
    return None if text == DEFAULT_NAME else urllib.parse.unquote(text)


def entity_path(entity: Entity) -> str:
    """``config/users/<u>``, ``config/users/<u>/clients/<c>``, ``config/clients/<c>`` or
    ``config/ips/<ip>`` (without the leading slash, as the metadata store names paths)."""
    parts = dict(entity)
    if IP in parts:
        return f"config/ips/{sanitize(parts[IP])}"
    if USER in parts and CLIENT_ID in parts:
        return f"config/users/{sanitize(parts[USER])}/clients/{sanitize(parts[CLIENT_ID])}"
    if USER in parts:
        return f"config/users/{sanitize(parts[USER])}"
    return f"config/clients/{sanitize(parts[CLIENT_ID])}"


def encode_config(values: Mapping[str, float]) -> dict:
    """The znode's JSON: ``{"version":1,"config":{key: text}}`` (Kafka keeps the texts)."""
    return {"version": 1, "config": {k: _text(v) for k, v in sorted(values.items())}}


def _text(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 2 ** 63 else repr(value)


def decode_config(stored) -> dict[str, float]:
    """Values of a stored entity; what does not parse is left out (logged by the caller)."""
    config = stored.get("config") if isinstance(stored, dict) else None
    if not isinstance(config, dict):
        return {}
    values = {}
    for key, text in config.items():
        try:
            value = float(text)
        except (TypeError, ValueError):
            continue
        if value > 0:  # as AlterClientQuotas would have it
            values[str(key)] = value
    return values
