"""Every API key the broker answers, and its handler: the union of the family modules'
``HANDLERS``. A new family is one more module in ``FAMILIES``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...protocol import api_versions as apis
from . import (
    acls,
    admin,
    api_meta,
    client_quotas_admin,
    cluster_views,
    configs_admin,
    consumer_groups,
    fetch,
    groups,
    partition_admin,
    produce,
    producer_ids,
    scram_users,
    transactions,
    txn_markers,
    unsecured,
)

FAMILIES = (api_meta, produce, fetch, admin, configs_admin, partition_admin, cluster_views,
            groups, consumer_groups, producer_ids, transactions, txn_markers, unsecured,
            client_quotas_admin, scram_users, acls)

HANDLERS: dict[int, Callable[[Any, Any], Any]] = {}
for _family in FAMILIES:
    _twice = HANDLERS.keys() & _family.HANDLERS.keys()
    assert not _twice, f"{_family.__name__} answers an API another module answers: {_twice}"
    HANDLERS.update(_family.HANDLERS)
assert set(HANDLERS) == set(apis.SUPPORTED_VERSIONS), "every advertised API needs a handler"
