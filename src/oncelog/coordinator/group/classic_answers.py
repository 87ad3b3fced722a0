"""What the classic group protocol answers (JoinGroup, SyncGroup) and the member ids it hands
out: shared by the classic coordinator (group_coordinator.py) and the classic members of a
consumer group (group_migration.py), so that neither imports the other for them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from kio.schema.errors import ErrorCode


def new_member_id(prefix: str) -> str:
    # Kafka's form (client or instance id, a dash, a UUID), the prefix cut so that the id
    # stays a short string whatever the client sent.
    return f"{prefix[:255]}-{uuid.uuid4()}"


@dataclass
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol: str | None = None
    assignment: bytes = b""
