"""DescribeClientQuotas and AlterClientQuotas: the quotas kept by broker/client_quotas.py,
decided by security/quota_configs.py (what may be set, what a filter matches); this module
only carries the answers into each version's response.

A describe with a bad filter is answered with the error and no entries; an alteration is
answered entry by entry, in the request's order, each entity as the request named it, once
the store has its writes (made off the event loop: the broker serves everyone else
meanwhile); more than 10,000 entries in one request are all refused (Kafka's bound on one
operation's records).
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from ...security.quota_configs import QuotaError
from .. import authorize
from ..authorize import Op
from ..log_limits import log_safe
from .api_meta import NO_THROTTLE

log = logging.getLogger(__name__)


def handle_describe_client_quotas(broker, request: Request):
    mod = response_module(apis.DESCRIBE_CLIENT_QUOTAS, request.api_version)
    body = request.body
    if not authorize.cluster(broker, request, Op.DESCRIBE_CONFIGS):  # as Kafka
        return build(mod.DescribeClientQuotasResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.cluster_authorization_failed,
                     error_message=ErrorCode.cluster_authorization_failed.name, entries=None)
    try:
        found = broker.quotas.describe(
            ((c.entity_type, c.match_type, c.match) for c in body.components), body.strict)
    except QuotaError as exc:
        return build(mod.DescribeClientQuotasResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode[exc.error.lower()], error_message=str(exc),
                     entries=None)
    entries = tuple(
        build(mod.EntryData,
              entity=tuple(build(mod.EntityData, entity_type=kind, entity_name=name)
                           for kind, name in entity),
              values=tuple(build(mod.ValueData, key=key, value=value)
                           for key, value in sorted(values.items())))
        for entity, values in found)
    return build(mod.DescribeClientQuotasResponse, throttle_time=NO_THROTTLE,
                 error_code=ErrorCode.none, error_message=None, entries=entries)


async def handle_alter_client_quotas(broker, request: Request):
    mod = response_module(apis.ALTER_CLIENT_QUOTAS, request.api_version)
    body = request.body
    entries = [(e.entity, [(d.entity_type, d.entity_name) for d in e.entity],
                [(o.key, o.value, o.remove) for o in e.ops]) for e in body.entries]
    if authorize.cluster(broker, request, Op.ALTER_CONFIGS):
        results = await broker.quotas.alter(entries, body.validate_only)
    else:  # every entry refused, as Kafka answers
        refused = ErrorCode.cluster_authorization_failed.name
        results = [(sent, refused, refused) for sent, _, _ in entries]
    answers = []
    for sent, error, message in results:
        if error is not None:
            log.info("AlterClientQuotas from %s: %s refused: %s (%s)",
                     log_safe(request.client_id),
                     log_safe([(d.entity_type, d.entity_name) for d in sent]),
                     log_safe(message), error)
        answers.append(build(
            mod.EntryData, error_code=ErrorCode.none if error is None
            else ErrorCode[error.lower()], error_message=message,
            entity=tuple(build(mod.EntityData, entity_type=d.entity_type,
                               entity_name=d.entity_name) for d in sent)))
    return build(mod.AlterClientQuotasResponse, throttle_time=NO_THROTTLE,
                 entries=tuple(answers))


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.DESCRIBE_CLIENT_QUOTAS: handle_describe_client_quotas,
    apis.ALTER_CLIENT_QUOTAS: handle_alter_client_quotas,
}
