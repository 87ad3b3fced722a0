"""Fault rules for the chaos proxy: what to do to the Nth request or response of an API.

A rule names an action, an API, and the occurrences it fires on (1-based, counted over every
connection through the proxy). A partition filter makes it count only requests naming that
topic-partition, so ``drop-response produce[orders-0]:3`` drops the answer to the third
produce request carrying a batch for orders-0.

Command-line form: ``API[TOPIC-PARTITION]:N[,N...][=MILLIS]``, e.g. ``produce:3,4``,
``fetch:2=1500`` (the delay, for the delay actions).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from ..protocol import api_versions as apis


class Action(enum.Enum):
    DROP_REQUEST = "drop-request"  # never forwarded: the broker does not see it
    DROP_RESPONSE = "drop-response"  # the broker acted; the client never hears
    DELAY_REQUEST = "delay-request"
    DELAY_RESPONSE = "delay-response"
    DUPLICATE_REQUEST = "duplicate-request"  # forwarded twice; the second answer is eaten
    CUT_AFTER_REQUEST = "cut-after-request"  # forwarded, answered, then the connection is cut
    # Fetch only: the answer comes back with no records (errors and offsets kept), as from a
    # broker whose records are not visible yet (a high watermark lagging after a new leader).
    EMPTY_RESPONSE = "empty-response"


API_NAMES = {
    "produce": apis.PRODUCE, "fetch": apis.FETCH, "list-offsets": apis.LIST_OFFSETS,
    "metadata": apis.METADATA, "find-coordinator": apis.FIND_COORDINATOR,
    "api-versions": apis.API_VERSIONS_KEY, "create-topics": apis.CREATE_TOPICS,
    "delete-topics": apis.DELETE_TOPICS, "describe-configs": apis.DESCRIBE_CONFIGS,
    "init-producer-id": apis.INIT_PRODUCER_ID, "describe-producers": apis.DESCRIBE_PRODUCERS,
}
_SPEC = re.compile(r"^([a-z-]+|\d+)(?:\[(.+)-(\d+)\])?:(\d+(?:,\d+)*)(?:=(\d+))?$")


@dataclass
class Rule:
    action: Action
    api_key: int
    occurrences: frozenset[int]
    topic: str | None = None
    partition: int | None = None
    delay_ms: int = 0
    seen: int = field(default=0, compare=False)  # matching requests counted so far

    @classmethod
    def parse(cls, action: Action, spec: str) -> Rule:
        match = _SPEC.match(spec.strip())
        if not match:
            raise ValueError(f"{action.value}: expected API[TOPIC-PARTITION]:N[,N...][=MS], "
                             f"got {spec!r}")
        name, topic, partition, numbers, delay = match.groups()
        api_key = int(name) if name.isdigit() else API_NAMES.get(name)
        if api_key is None:
            raise ValueError(f"{action.value}: unknown API {name!r}; one of "
                             f"{', '.join(sorted(API_NAMES))}")
        if action is Action.EMPTY_RESPONSE and api_key != apis.FETCH:
            raise ValueError(f"{action.value}: only for fetch")
        delayed = action in (Action.DELAY_REQUEST, Action.DELAY_RESPONSE)
        if delayed != (delay is not None):
            raise ValueError(f"{action.value}: " + ("needs =MILLIS" if delayed
                                                    else "takes no =MILLIS"))
        return cls(action, api_key, frozenset(int(n) for n in numbers.split(",")), topic,
                   int(partition) if partition is not None else None, int(delay or 0))

    def describe(self) -> str:
        name = next((n for n, k in API_NAMES.items() if k == self.api_key), str(self.api_key))
        where = f"[{self.topic}-{self.partition}]" if self.topic is not None else ""
        delay = f"={self.delay_ms}" if self.delay_ms else ""
        numbers = ",".join(str(n) for n in sorted(self.occurrences))
        return f"{self.action.value} {name}{where}:{numbers}{delay}"
