"""Client quotas, sans-IO: whose quota a request counts against, the rate it is measured at,
and how long a client over its quota is throttled. Kafka's rules (ClientQuotaManager, its
default quota callback, Rate over SampledStat, QuotaUtils), each in one place here.

**Entities.** A quota is configured on an entity: a user (the principal's name), a client id,
or both; either name may be the default (``<default>``, ``None`` here), which applies to
every user (client id) that has no entity of its own. Each quota key (``producer_byte_rate``,
``consumer_byte_rate``, ``request_percentage``) is resolved on its own: only the entities that
configure that key take part.

**Resolution** (``resolve``), for a request of user U with client id C: the first row whose
entity exists decides which requests share one measured rate (the sensor); the quota is then
the first entity found in that sensor's lookup order. Kafka's order (KIP-55):

    | # | first entity that exists (this key) | sensor shared by | quota: the first of       |
    |---|-------------------------------------|------------------|---------------------------|
    | 1 | users/U/clients/C                   | (U, C)           | users/U/clients/C,        |
    | 2 | users/U/clients/<default>           | (U, C)           | users/U/clients/<default>,|
    |   |                                     |                  | users/<default>/clients/C,|
    |   |                                     |                  | users/<default>/clients/  |
    |   |                                     |                  |   <default>               |
    | 3 | users/U                             | (U, -)           | users/U, users/<default>  |
    | 4 | users/<default>/clients/C           | (U, C)           | as row 1                  |
    | 5 | users/<default>/clients/<default>   | (U, C)           | as row 1                  |
    | 6 | users/<default>                     | (U, -)           | as row 3                  |
    | 7 | clients/C                           | (-, C)           | clients/C,                |
    |   |                                     |                  | clients/<default>         |
    | 8 | clients/<default> (or nothing)      | (-, C)           | as row 7                  |
    | 9 | any row, with an empty client id    | as above, C = "" | (U, ""): as row 3;        |
    |   |                                     |                  | (-, ""): no quota         |

Row 9 is Kafka's too: its callback looks a sensor with an empty client id up as a user's
(users/U, users/<default>), and one with neither name finds no quota.

**Measuring** (``Rate``): the values recorded (bytes, or request time in percent of a second)
fall into ``quota.window.num`` samples of ``quota.window.size.seconds`` each, a new sample
started when the current one is a window old (the oldest is reused). A sample with no event
for ``num * size`` is reset. The rate is the sum of the samples over the elapsed time since
the oldest sample started, but never less than ``num - 1`` whole windows: a client that just
started is measured as if it had been quiet before, so it may send ``(num - 1) * size *
quota`` at once before it is throttled (Kafka's burst).

**Throttling** (``throttle_ms``): a value is recorded first, then the rate O is compared with
the quota T; O <= T is no throttle. Otherwise the client waits X such that ``O * W / (W + X)
= T`` (W the window the rate was measured over): ``X = (O - T) / T * W``, rounded to a
millisecond:

    | quota              | recorded                              | throttle bounded by            |
    |--------------------|---------------------------------------|--------------------------------|
    | producer_byte_rate | the Produce request's size            | int32 (the answer's field)     |
    | consumer_byte_rate | the Fetch answer's size               | int32                          |
    | request_percentage | handler time, % of one second         | one window (quota.window.size) |

The request quota's bound is Kafka's (ClientRequestQuotaManager): one slow request must not
silence a client for the whole span. A throttled Fetch is answered empty and its bytes are
taken back out of the rate (Kafka's unrecord), so a consumer pays only for what it gets.

**Controller mutations** (``controller_mutation_rate``, KIP-599): each partition a
CreateTopics creates, a CreatePartitions adds or a DeleteTopics deletes is one mutation, taken
from a ``TokenBucket`` of ``burst = rate x controller.quota.window.num x
controller.quota.window.size.seconds`` tokens refilled at ``rate`` a second (a client may make
a burst at once, then ``rate`` a second). Below zero tokens the quota is exceeded, and the
wait is ``-tokens / rate`` seconds. Each topic of a request is asked ``mutation_refused``
before it is done and, once done, ``mutation_taken``:

    | # | request version        | tokens before | the topic              | answer's throttle |
    |---|------------------------|---------------|------------------------|-------------------|
    | 1 | strict: CreateTopics   | >= 0          | done, its partitions   | 0, unless a later |
    |   | v6+, CreatePartitions  |               | taken (may go below 0) | topic is refused  |
    |   | v3+, DeleteTopics v5+  |               |                        |                   |
    | 2 | strict                 | < 0           | THROTTLING_QUOTA_      | -tokens / rate    |
    |   |                        |               | EXCEEDED, none taken   | at the refusal    |
    | 3 | older (permissive)     | any           | done, taken            | -tokens / rate    |
    |   |                        |               |                        | when below 0      |

A request whose answer carries a throttle also mutes its connection for that long (KIP-219),
as the other quotas do. A validate-only request, and a topic refused for another reason, takes
nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"
CLIENT_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)

INT32_MAX = (1 << 31) - 1
NANOS_TO_PERCENT = 100.0 / 1e9  # a nanosecond of handler time, in percent of one second

# An entity: its (type, name) pairs sorted by type, a name None for the default
# ("<default>"). ((CLIENT_ID, "x"),) is clients/x; ((CLIENT_ID, None), (USER, "u")) is
# users/u/clients/<default>.
Entity = tuple[tuple[str, "str | None"], ...]
# Which requests share a measured rate: (user or "", client id or ""), Kafka's metric tags.
SensorKey = tuple[str, str]


def entity(user: str | bool | None = False, client_id: str | bool | None = False) -> Entity:
    """An entity by its parts: a name, None for the default, False for no such part."""
    parts = []
    if client_id is not False:
        parts.append((CLIENT_ID, client_id))
    if user is not False:
        parts.append((USER, user))
    return tuple(parts)  # type: ignore[return-value]


def resolve(configured: Mapping[Entity, float], user: str, client_id: str
            ) -> tuple[SensorKey, float | None]:
    """The sensor a request of ``user`` with ``client_id`` counts against and its quota
    (None: none), given the entities configuring one key (the table's rows 1-9)."""
    u, c = user, client_id
    if entity(u, c) in configured or entity(u, None) in configured:
        tags = (u, c)  # rows 1, 2
    elif entity(u) in configured:
        tags = (u, "")  # row 3
    elif entity(None, c) in configured or entity(None, None) in configured:
        tags = (u, c)  # rows 4, 5
    elif entity(None) in configured:
        tags = (u, "")  # row 6
    else:
        tags = ("", c)  # rows 7, 8 (9 when c is empty)
    return tags, _limit(configured, tags)


def _limit(configured: Mapping[Entity, float], tags: SensorKey) -> float | None:
    u, c = tags
    if u and c:
        order = (entity(u, c), entity(u, None), entity(None, c), entity(None, None))
    elif u:
        order = (entity(u), entity(None))
    elif c:
        order = (entity(client_id=c), entity(client_id=None))
    else:
        return None
    for candidate in order:
        quota = configured.get(candidate)
        if quota is not None:
            return quota
    return None


class Rate:
    """Kafka's Rate over a SampledStat of ``samples`` windows of ``window_ms`` each."""

    __slots__ = ("_current", "_samples", "samples", "window_ms")

    def __init__(self, samples: int, window_ms: int) -> None:
        self.samples = samples
        self.window_ms = window_ms
        # each [start ms, last event ms, value, events]; one more than ``samples``: the
        # sample overlapping the start of the measured span is kept (Kafka's placeholder)
        self._samples: list[list] = []
        self._current = 0

    def record(self, value: float, now_ms: int) -> None:
        if not self._samples:
            self._samples.append([now_ms, now_ms, 0.0, 0])
        sample = self._samples[self._current]
        if now_ms - sample[0] >= self.window_ms:
            self._current = (self._current + 1) % (self.samples + 1)
            if self._current >= len(self._samples):
                sample = [now_ms, now_ms, 0.0, 0]
                self._samples.append(sample)
            else:
                sample = self._samples[self._current]
                sample[:] = [now_ms, now_ms, 0.0, 0]
        sample[2] += value
        sample[3] += 1
        sample[1] = now_ms

    def _purge(self, now_ms: int) -> None:
        expire = self.samples * self.window_ms
        for sample in self._samples:
            if now_ms - sample[1] >= expire:
                sample[:] = [now_ms, now_ms, 0.0, 0]

    def window_size(self, now_ms: int) -> int:
        """The span the rate is measured over: since the oldest sample started, at least
        ``samples - 1`` whole windows, at least 1 ms."""
        self._purge(now_ms)
        oldest = min((s[0] for s in self._samples), default=now_ms)
        elapsed = now_ms - oldest
        whole = elapsed // self.window_ms
        if whole < self.samples - 1:
            elapsed += (self.samples - 1 - whole) * self.window_ms
        return max(elapsed, 1)

    def measure(self, now_ms: int) -> float:
        """Per second."""
        window = self.window_size(now_ms)  # purges first
        return self.total() / (window / 1000.0)

    def total(self) -> float:
        """What the samples hold (as last purged)."""
        return sum(s[2] for s in self._samples)

    def idle_since(self) -> int:
        return max((s[1] for s in self._samples), default=-1)


def throttle_ms(rate: Rate, quota: float, now_ms: int, bound_ms: int = INT32_MAX) -> int:
    """How long a client measured by ``rate`` (its value just recorded) waits: 0 within its
    quota, else ``(O - T) / T * W`` rounded, at most ``bound_ms`` (the table above)."""
    window = rate.window_size(now_ms)  # purges first
    observed = rate.total() / (window / 1000.0)
    if observed <= quota:
        return 0
    # Java's Math.round: halves up (Python's round would go to even)
    return min(math.floor((observed - quota) / quota * window + 0.5), bound_ms, INT32_MAX)


# CreateTopics, CreatePartitions, DeleteTopics: the first version refused over the quota
# (KIP-599's THROTTLING_QUOTA_EXCEEDED); older ones are done and throttled.
STRICT_MUTATION_SINCE = {19: 6, 37: 3, 20: 5}


class TokenBucket:
    """KIP-599's bucket: ``burst`` tokens at most, refilled at ``rate`` a second; full when
    first measured."""

    __slots__ = ("last_ms", "tokens")

    def __init__(self) -> None:
        self.tokens: float | None = None
        self.last_ms = 0

    def measure(self, rate: float, burst: float, now_ms: int) -> float:
        if self.tokens is None:
            self.tokens = burst
        else:
            self.tokens = min(burst, self.tokens + rate * max(0, now_ms - self.last_ms) / 1000)
        self.last_ms = now_ms
        return self.tokens

    def take(self, value: float, rate: float, burst: float, now_ms: int) -> float:
        self.tokens = self.measure(rate, burst, now_ms) - value
        return self.tokens


def mutation_throttle_ms(tokens: float, rate: float) -> int:
    """How long a client whose bucket holds ``tokens`` waits: 0 at zero or above."""
    if tokens >= 0:
        return 0
    return min(math.floor(-tokens / rate * 1000 + 0.5), INT32_MAX)


def mutation_refused(strict: bool, bucket: TokenBucket, rate: float, burst: float,
                     now_ms: int) -> int:
    """Asked before a topic is done: the answer's throttle when it is refused (row 2), else 0
    (rows 1 and 3: it may be done)."""
    if not strict:
        return 0
    return mutation_throttle_ms(bucket.measure(rate, burst, now_ms), rate)


def mutation_taken(strict: bool, bucket: TokenBucket, mutations: int, rate: float,
                   burst: float, now_ms: int) -> int:
    """A topic done: its mutations taken; the answer's throttle for it (row 3; 0 in row 1,
    whose tokens may go below zero unthrottled)."""
    tokens = bucket.take(mutations, rate, burst, now_ms)
    return 0 if strict else mutation_throttle_ms(tokens, rate)
