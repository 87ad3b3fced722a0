"""What a caller may do to a resource, as the ``*_authorized_operations`` fields answer it.

Kafka encodes a set of AclOperation codes as a 32-bit field (bit ``code`` set for each
operation): the operations the caller is allowed (``oncelog.broker.authorize.operations``;
without an authorizer, every operation the resource type supports). Left out when not asked
for: the schema's default, -2^31 ("omitted").
"""

from __future__ import annotations

OMITTED = -(1 << 31)
