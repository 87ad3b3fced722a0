"""The broker's client quotas: the configured entities (kept in the metadata store at Kafka's
ZooKeeper paths), the measured rates, and the throttle each request gets. The rules are
security/quotas.py's (resolution, rates, throttle time) and security/quota_configs.py's
(what may be set, what a describe matches); this module only keeps state and asks them.

Enforcement as Kafka 2.0+ (KIP-219): the answer goes out at once with ``throttle_time_ms``
set, then its connection is muted (nothing read, nothing handled) for that long
(server.Connection). Each answer that has the field carries the larger of the request's
throttles:

* ``producer_byte_rate``: a Produce request's size is recorded before it is handled;
* ``consumer_byte_rate``: a Fetch answer's record bytes are recorded once it is read; a Fetch
  over its quota is answered empty instead (its bytes taken back out of the rate);
* ``request_percentage``: the time a handler holds the event loop (its synchronous part:
  two ``perf_counter_ns`` calls a request, only while some request quota is configured) is
  recorded when it returns, and checked when the client's next request arrives: the answer
  that carries the throttle is the one after the time was spent. The broker is one event
  loop, one "request handler thread", so 100 percent is all of it (Kafka's quota is per
  thread: ``request_percentage`` 100 is one of its threads).

In a cluster the entities are ZooKeeper's (``/config/users/...``, ``/config/clients/...``,
``{"version":1,"config":{...}}``), and each change adds Kafka's notification
``/config/changes/config_change_<seq>`` = ``{"version":2,"entity_path":"clients/<c>"}``;
every broker looks for new notifications every second (``follow_changes``) and reloads the
entities when there is one, so all enforce the same quotas.

``controller_mutation_rate`` (KIP-599): CreateTopics, CreatePartitions and DeleteTopics ask
``mutations(request)`` for the request's ``MutationQuota``, ask it whether each topic is
``refused`` (THROTTLING_QUOTA_EXCEEDED) and tell it each one ``done`` with its partitions, by
security/quotas.py's mutation table; their
answer carries its throttle, and the server mutes the connection for it
(``take_mutation_throttle``, right after the handler's synchronous part).

An ip entity's ``connection_creation_rate`` counts the connections an address opens: one
over it is held unread for its throttle time (at most one window) and then closed, as
Kafka's acceptor does, so a client reconnecting in a loop is slowed, not served.

Nothing is measured while no entity configures a client key (``active`` is False): the hot
path pays one attribute check. Rates of clients idle for the whole span (every sample
purged) are forgotten, so client ids cost memory only while they are in use, and at most
``MAX_RATES`` are kept.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import datetime
import logging
import time
from collections.abc import Iterable
from typing import Any

from ..metadata.store import (
    NO_VERSION,
    BadVersion,
    MetadataStore,
    MetadataUnavailable,
    race_attempts,
)
from ..security import quota_configs as qc
from ..security import quotas as q
from .log_limits import log_safe

log = logging.getLogger(__name__)

# API keys whose requests are never throttled (Kafka exempts authentication and the
# cluster's own requests).
_EXEMPT = frozenset({17, 36, 27})  # SaslHandshake, SaslAuthenticate, WriteTxnMarkers
_PRODUCE = 0
_FETCH = 1
MAX_ALTERATIONS_PER_REQUEST = 10_000
# Rates kept at most (each a few hundred bytes): a client inventing a client id per request
# under a clients/<default> quota costs this much memory, not more; past it the oldest rate
# is forgotten (its client measured afresh, as after the span of quiet that expires it).
MAX_RATES = 100_000
# The store's writes of AlterClientQuotas, one at a time, off the event loop.
_WRITER = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="oncelog-quotas")
# (entity as sent, error name or None, message, entity, its changes / values)
_Entry = tuple[Any, "str | None", "str | None", "q.Entity | None", "dict | None"]
_CHANGES = "config/changes"
_CHANGE_PREFIX = "config_change_"


class ClientQuotas:
    def __init__(self, config, store: MetadataStore) -> None:
        self.store = store
        self.samples: int = config.get("quota.window.num")
        self.window_ms: int = config.get("quota.window.size.seconds") * 1000
        self.entities: dict[q.Entity, dict[str, float]] = {}
        self._by_key: dict[str, dict[q.Entity, float]] = {}
        self._ip_quotas: dict[q.Entity, float] = {}
        self._rates: dict[tuple[str, str, str], q.Rate] = {}
        self._buckets: dict[tuple[str, str], q.TokenBucket] = {}  # controller mutations
        self.mutation_window_ms: int = config.get("controller.quota.window.size.seconds") * 1000
        self.mutation_samples: int = config.get("controller.quota.window.num")
        self._mutation_throttle = 0  # the last handler's, until the server takes it
        self.active = False
        self.time_measured = False
        self.throttled = 0  # answers that carried a throttle (for operators and tests)
        # the cluster's ZooKeeper: notify the other brokers of each change, and follow theirs
        self.in_cluster = hasattr(store, "create_sequential")
        self._last_change = self._latest_change() if self.in_cluster else None
        self.load()

    # --- the configured entities ------------------------------------------------------------

    def load(self) -> None:
        """Every entity in the store (at start)."""
        self.entities = self._read_all()
        self._derive()

    def _read_all(self) -> dict[q.Entity, dict[str, float]]:
        entities: dict[q.Entity, dict[str, float]] = {}
        users = {name.split("/")[0] for name in self.store.children("config/users")}
        for user in sorted(users):
            self._load_one(entities, qc.entity_path(((q.USER, qc.desanitize(user)),)))
            for client in self.store.children(f"config/users/{user}/clients"):
                if "/" not in client:
                    self._load_one(entities, f"config/users/{user}/clients/{client}")
        for folder in ("clients", "ips"):
            for name in self.store.children(f"config/{folder}"):
                if "/" not in name:
                    self._load_one(entities, f"config/{folder}/{name}")
        return entities

    def _load_one(self, into: dict, path: str) -> None:
        stored, _ = self.store.get(path)
        if stored is None:
            return
        values = qc.decode_config(stored)
        config = stored.get("config") if isinstance(stored, dict) else None
        if not isinstance(config, dict) or len(values) < len(config):
            log.warning("%s: left out what does not parse in %s", log_safe(path),
                        log_safe(stored))
        if values:
            into[_entity_of(path)] = values

    def _derive(self) -> None:
        by_key: dict[str, dict[q.Entity, float]] = {
            k: {} for k in (*q.CLIENT_KEYS, q.CONTROLLER_MUTATION_RATE)}
        for entity, values in self.entities.items():
            for key, value in values.items():
                if key in by_key:
                    by_key[key][entity] = value
        self._by_key = by_key
        self._ip_quotas = {e: v[q.CONNECTION_CREATION_RATE] for e, v in self.entities.items()
                           if q.CONNECTION_CREATION_RATE in v}
        self.active = any(by_key.values())
        self.time_measured = bool(by_key[q.REQUEST_PERCENTAGE])

    def plan(self, entries: Iterable[tuple[Any, list, list]]) -> list[_Entry]:
        """Each (entity as sent, parts, ops) entry checked by Kafka's rules (quota_configs'
        table): (entity as sent, error name or None, message, entity, changes)."""
        entries = list(entries)
        if len(entries) > MAX_ALTERATIONS_PER_REQUEST:  # Kafka's MAX_RECORDS_PER_USER_OP
            return [(sent, "UNKNOWN_SERVER_ERROR", f"more than {MAX_ALTERATIONS_PER_REQUEST} "
                     f"quota alterations in one request", None, None) for sent, _, _ in entries]
        planned: list[_Entry] = []
        seen: set[q.Entity] = set()
        for sent, parts, ops in entries:
            try:
                entity = qc.validate_entity(parts)
                changes = qc.validate_ops(entity, ops)
                if entity in seen:
                    raise qc.QuotaError(qc.INVALID_REQUEST, "Ignoring duplicate entity")
                seen.add(entity)
            except qc.QuotaError as exc:
                planned.append((sent, exc.error, str(exc), None, None))
                continue
            planned.append((sent, None, None, entity, changes))
        return planned

    def write(self, planned: list[_Entry]) -> list[_Entry]:
        """The store's side of ``plan``'s entries (in a worker thread: each entry is a
        compare-and-set, an fsync or a ZooKeeper round trip): the same entries, each with
        its entity's values now ({} when it has none left) or the error that stopped it."""
        written: list[_Entry] = []
        for sent, error, message, entity, changes in planned:
            if error is None:
                try:
                    changes = self._write(entity, changes)
                except qc.QuotaError as exc:
                    error, message = exc.error, str(exc)
                except OSError as exc:  # a full disk: nothing of this entry changed
                    log.error("client quotas of %s not written: %s", entity, exc)
                    error, message = "UNKNOWN_SERVER_ERROR", f"writing it failed: {exc}"
                except Exception as exc:
                    if not self.in_cluster or not _zookeeper_away(exc):
                        raise
                    # ZooKeeper away: this entry not written (or, when its notification
                    # failed, not yet seen by the other brokers)
                    error, message = "REQUEST_TIMED_OUT", f"ZooKeeper: {exc!r}"
            written.append((sent, error, message, entity, changes))
        return written

    def apply(self, written: list[_Entry]) -> None:
        """``write``'s outcome into what the broker enforces (on the event loop)."""
        for _, error, _, entity, values in written:
            if error is None and values:
                self.entities[entity] = values
            elif error is None:
                self.entities.pop(entity, None)
        self._derive()

    async def alter(self, entries: Iterable[tuple[Any, list, list]], validate_only: bool
                    ) -> list[tuple[Any, str | None, str | None]]:
        """(entity as sent, error name or None, message) for each entry: checked, then
        (unless ``validate_only``) written by the writer thread and applied."""
        planned = self.plan(entries)
        if not validate_only and any(error is None for _, error, _, _, _ in planned):
            planned = await asyncio.get_running_loop().run_in_executor(_WRITER, self.write,
                                                                       planned)
            self.apply(planned)
        return [(sent, error, message) for sent, error, message, _, _ in planned]

    def _write(self, entity: q.Entity, changes: dict[str, float | None]) -> dict[str, float]:
        path = qc.entity_path(entity)
        for _ in race_attempts(f"change {path}"):
            stored, version = self.store.get(path)
            values = qc.applied(qc.decode_config(stored), changes)
            try:
                if values:
                    self.store.compare_and_set(path, qc.encode_config(values), version)
                elif version != NO_VERSION:
                    self.store.delete(path, version)
            except BadVersion:
                continue
            break
        if self.in_cluster:
            self.store.create_sequential(_CHANGES + "/" + _CHANGE_PREFIX,  # type: ignore
                                         {"version": 2, "entity_path": path[len("config/"):]})
        log.info("client quotas of %s are now %s", log_safe(path), values or "none")
        return values

    def _latest_change(self) -> str | None:
        return max((n for n in self.store.children(_CHANGES) if n.startswith(_CHANGE_PREFIX)),
                   default=None)

    async def follow_changes(self) -> None:
        """Reload the entities when another broker (or this one) notified a change; the
        store is read by the writer thread (ZooKeeper round trips stay off the loop)."""
        loop = asyncio.get_running_loop()
        try:
            latest = await loop.run_in_executor(_WRITER, self._latest_change)
            if latest == self._last_change:
                return
            entities = await loop.run_in_executor(_WRITER, self._read_all)
        except Exception as exc:
            if not _zookeeper_away(exc):
                raise
            # the next look (a second later) reads again what ZooKeeper holds then
            log.warning("following client quota changes cut short by ZooKeeper: %r", exc)
            return
        self.entities = entities
        self._last_change = latest
        self._derive()

    def describe(self, components: Iterable[tuple[str, int, str | None]], strict: bool
                 ) -> list[tuple[q.Entity, dict[str, float]]]:
        """The entities a filter matches (QuotaError for a bad filter)."""
        filter_ = qc.parse_filter(components, strict)
        return [(entity, values) for entity, values in sorted(
            self.entities.items(), key=lambda item: repr(item[0]))
            if qc.matches(entity, filter_)]

    # --- enforcement ------------------------------------------------------------------------

    def before(self, request) -> int:
        """The throttle a request gets before it is handled (produce bytes, and the request
        time its client spent before); 0 for most."""
        if request.api_key in _EXEMPT:
            return 0
        user, client = _who(request)
        now = _now_ms()
        throttle = 0
        if request.api_key == _PRODUCE:
            throttle = self._record(q.PRODUCER_BYTE_RATE, user, client, request.size, now)
        if self.time_measured:
            throttle = max(throttle, self._record(q.REQUEST_PERCENTAGE, user, client, 0.0, now,
                                                  self.window_ms))
        return throttle

    def handled(self, request, nanos: int) -> None:
        """A handler held the loop ``nanos``: counted now, checked at the next request."""
        if request.api_key in _EXEMPT:
            return
        user, client = _who(request)
        tags, quota = q.resolve(self._by_key[q.REQUEST_PERCENTAGE], user, client)
        if quota is not None:
            self._rate(q.REQUEST_PERCENTAGE, tags).record(nanos * q.NANOS_TO_PERCENT,
                                                          _now_ms())

    def fetched(self, request, body) -> tuple[Any, int]:
        """A Fetch answer's bytes recorded against its consumer_byte_rate: (the answer,
        throttle ms); over the quota, the answer is empty and its bytes taken back."""
        user, client = _who(request)
        tags, quota = q.resolve(self._by_key[q.CONSUMER_BYTE_RATE], user, client)
        throttle = request.throttle_ms
        if quota is not None:
            size = sum(len(p.records or b"") for t in body.responses for p in t.partitions)
            now = _now_ms()
            rate = self._rate(q.CONSUMER_BYTE_RATE, tags)
            rate.record(size, now)
            throttle = max(throttle, q.throttle_ms(rate, quota, now))
            if throttle:
                rate.record(-size, now)  # Kafka's unrecord: an empty answer costs nothing
        if throttle:
            for t in body.responses:  # a region left unsent holds a file descriptor
                for p in t.partitions:
                    if hasattr(p.records, "close"):
                        p.records.close()
            body = dataclasses.replace(body, responses=())
        return body, throttle

    def connection_throttle(self, ip: str) -> int:
        """A new connection from ``ip`` counted against its ``connection_creation_rate``
        (ips/<ip>, else ips/<default>): how long to hold it before closing it unserved (0:
        serve it), at most one window, as Kafka's acceptor throttles it."""
        ips = self._ip_quotas
        if not ips:
            return 0
        quota = ips.get(((q.IP, ip),), ips.get(((q.IP, None),)))
        if quota is None:
            return 0
        rate = self._rate(q.CONNECTION_CREATION_RATE, (ip, ""))
        now = _now_ms()
        rate.record(1, now)
        return q.throttle_ms(rate, quota, now, self.window_ms)

    def mutations(self, request) -> MutationQuota:
        """The controller_mutation_rate of a CreateTopics, CreatePartitions or DeleteTopics
        request's client (UNLIMITED without one)."""
        if not self.active or not self._by_key[q.CONTROLLER_MUTATION_RATE]:
            return UNLIMITED
        tags, rate = q.resolve(self._by_key[q.CONTROLLER_MUTATION_RATE], *_who(request))
        if rate is None:
            return UNLIMITED
        bucket = self._buckets.get(tags)
        if bucket is None:
            if len(self._buckets) >= MAX_RATES:
                self.expire()
                while len(self._buckets) >= MAX_RATES:
                    del self._buckets[next(iter(self._buckets))]
            bucket = self._buckets[tags] = q.TokenBucket()
        strict = request.api_version >= q.STRICT_MUTATION_SINCE[request.api_key]
        return MutationQuota(self, bucket, rate, strict)

    def take_mutation_throttle(self) -> int:
        """The throttle the handler just run gave its answer for controller mutations (0):
        its connection is muted for it."""
        throttle, self._mutation_throttle = self._mutation_throttle, 0
        return throttle

    def fetch_allowance(self, request) -> int:
        """The most a Fetch may read (Kafka's getMaxValueInQuotaWindow): what its consumer's
        quota allows over the whole span but the current window, so that one answer alone is
        not over it; at least 1 (a first batch larger than that is still read)."""
        if not self.active:
            return q.INT32_MAX
        _, quota = q.resolve(self._by_key[q.CONSUMER_BYTE_RATE], *_who(request))
        if quota is None:
            return q.INT32_MAX
        return max(1, int(quota * (self.samples - 1) * self.window_ms / 1000))

    def _record(self, key: str, user: str, client: str, value: float, now: int,
                bound: int = q.INT32_MAX) -> int:
        tags, quota = q.resolve(self._by_key[key], user, client)
        if quota is None:
            return 0
        rate = self._rate(key, tags)
        rate.record(value, now)
        return q.throttle_ms(rate, quota, now, bound)

    def _rate(self, key: str, tags: q.SensorKey) -> q.Rate:
        rate = self._rates.get((key, *tags))
        if rate is None:
            if len(self._rates) >= MAX_RATES:  # client ids made up by the thousand
                self.expire()
                while len(self._rates) >= MAX_RATES:  # the oldest made go first
                    del self._rates[next(iter(self._rates))]
            rate = self._rates[(key, *tags)] = q.Rate(self.samples, self.window_ms)
        return rate

    def expire(self) -> None:
        """Forget the rates with nothing recorded for the whole span: they measure 0, as a
        new one would."""
        now = _now_ms()
        cutoff = now - self.samples * self.window_ms
        for key in [k for k, rate in self._rates.items() if rate.idle_since() < cutoff]:
            del self._rates[key]
        # a bucket untouched this long is full again, as a new one is
        cutoff = now - self.mutation_samples * self.mutation_window_ms
        for tags in [t for t, b in self._buckets.items() if b.last_ms < cutoff]:
            del self._buckets[tags]


class MutationQuota:
    """One request's controller mutations (security/quotas.py's table)."""

    __slots__ = ("_bucket", "_quotas", "burst", "rate", "strict", "throttle_ms")

    def __init__(self, quotas: ClientQuotas | None, bucket: q.TokenBucket | None, rate: float,
                 strict: bool) -> None:
        self._quotas = quotas
        self._bucket = bucket
        self.rate = rate
        self.strict = strict
        self.throttle_ms = 0
        self.burst = 0.0 if quotas is None else \
            rate * quotas.mutation_samples * quotas.mutation_window_ms / 1000

    def refused(self) -> bool:
        """Asked before a topic is done: True when it is refused THROTTLING_QUOTA_EXCEEDED."""
        if self._bucket is None:
            return False
        return self._throttle(q.mutation_refused(self.strict, self._bucket, self.rate,
                                                 self.burst, _now_ms())) > 0

    def done(self, partitions: int) -> None:
        """A topic done: its ``partitions`` mutations taken."""
        if self._bucket is not None:
            self._throttle(q.mutation_taken(self.strict, self._bucket, partitions, self.rate,
                                            self.burst, _now_ms()))

    def _throttle(self, throttle: int) -> int:
        if throttle and self._quotas is not None:
            self.throttle_ms = max(self.throttle_ms, throttle)
            self._quotas._mutation_throttle = max(self._quotas._mutation_throttle, throttle)
        return throttle

    @property
    def throttle_time(self) -> datetime.timedelta:
        """For the answer's throttle_time_ms."""
        return datetime.timedelta(milliseconds=self.throttle_ms)


UNLIMITED = MutationQuota(None, None, 0.0, False)
THROTTLING_QUOTA_EXCEEDED_MESSAGE = "The throttling quota has been exceeded."


def _zookeeper_away(exc: Exception) -> bool:
    """A lost connection or session (kazoo's errors; kazoo is there in cluster mode only)."""
    if isinstance(exc, MetadataUnavailable):
        return True
    from kazoo.exceptions import KazooException

    return isinstance(exc, KazooException)


def _who(request) -> tuple[str, str]:
    session = request.session
    user = session.principal.name if session is not None else ""
    return user, request.client_id or ""


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _entity_of(path: str) -> q.Entity:
    segments = path.split("/")[1:]  # config/<kind>/<name>[/clients/<name>]
    kinds = {"users": q.USER, "clients": q.CLIENT_ID, "ips": q.IP}
    parts = [(kinds[segments[i]], qc.desanitize(segments[i + 1]))
             for i in range(0, len(segments) - 1, 2)]
    return tuple(sorted(parts))


def with_throttle(body, throttle_ms: int):
    """A kio answer carrying ``throttle_ms`` where its version has the field (or the larger
    throttle its handler gave it: a controller mutation's)."""
    if "throttle_time" not in getattr(type(body), "__dataclass_fields__", ()):
        return body
    throttle = datetime.timedelta(milliseconds=throttle_ms)
    if body.throttle_time is not None and body.throttle_time > throttle:
        return body
    return dataclasses.replace(body, throttle_time=throttle)
