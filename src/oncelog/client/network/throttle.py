"""KIP-219 on the client's side: an answer with ``throttle_time_ms`` > 0 means the broker
mutes the connection for that long; the client sends nothing more on it until then (as
librdkafka and the Java client do), so its requests wait here, not in the broker's socket
buffer, and their timeouts start when they are sent.

Where an answer's throttle is: kio's decoded answers have ``throttle_time`` (a timedelta);
Produce answers decoded by protocol/produce_response.py carry ``throttle_ms``; a Fetch
answer read raw (the consumer's) has it first after the response header (v1 on).
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

from ...protocol import api_versions as apis

_I32 = struct.Struct(">i")
_FETCH_FLEXIBLE_FROM = 12


def throttle_seconds(body: Any) -> float:
    """The throttle a decoded answer asks for (0.0: none)."""
    throttle = getattr(body, "throttle_time", None)
    if isinstance(throttle, datetime.timedelta):
        return max(0.0, throttle.total_seconds())
    ms = getattr(body, "throttle_ms", 0)
    return ms / 1000 if isinstance(ms, int) and ms > 0 else 0.0


def raw_throttle_seconds(api_key: int, version: int, frame: bytes | bytearray | memoryview
                         ) -> float:
    """The throttle of an answer's frame read raw (correlation id first): Fetch's; 0.0 for
    the others, and for a flexible header with tagged fields (none are defined)."""
    if api_key != apis.FETCH or version < 1:
        return 0.0
    pos = 4
    if version >= _FETCH_FLEXIBLE_FROM:
        if len(frame) < 5 or frame[4] != 0:
            return 0.0
        pos = 5
    if len(frame) < pos + 4:
        return 0.0
    (ms,) = _I32.unpack_from(frame, pos)
    return ms / 1000 if ms > 0 else 0.0
