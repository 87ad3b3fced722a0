"""Client metrics under Kafka's names (the Java clients' producer-metrics and
consumer-fetch-manager-metrics), read with ``metrics()`` or pushed as JSON to a librdkafka
style ``stats_cb`` every ``statistics.interval.ms``.

Rates, averages and maxima are over a sliding window as Kafka measures them: two samples of
30 s (``metrics.sample.window.ms``, ``metrics.num.samples``); a rate is per second over the
time the samples span, at least one window. Totals count since the client started.

Producer: ``record-send-rate`` / ``-total`` (records sent, every attempt), ``record-retry-rate``
/ ``-total`` (records sent again), ``record-error-rate`` / ``-total`` (records that failed,
and, as seed 004 says, records the broker refused as duplicates of stored ones:
DUPLICATE_SEQUENCE_NUMBER is logged and counted, not raised), ``batch-size-avg`` / ``-max``
(bytes), ``records-per-request-avg``, ``request-rate`` / ``-total``, ``request-latency-avg``
/ ``-max`` (ms, Produce requests); and, beyond Kafka's names, ``record-duplicate-rate`` /
``-total`` (the duplicates answered) and ``epoch-bump-total`` (new epochs or producer ids
after the first).

Consumer: ``records-consumed-rate`` / ``-total``, ``bytes-consumed-rate`` / ``-total``,
``fetch-rate`` / ``fetch-total``, ``fetch-latency-avg`` / ``-max`` and ``request-latency-avg``
/ ``-max`` (ms), ``records-lag-max`` (the largest lag of a partition in the last fetches:
its high watermark, or with read_committed its last stable offset, minus the position),
and ``records-per-request-avg``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)
WINDOW = 30.0   # seconds per sample (Kafka's metrics.sample.window.ms)
SAMPLES = 2     # Kafka's metrics.num.samples


class Stat:
    """One measured quantity: its samples (window start, count, sum, max) and totals."""

    __slots__ = ("count", "samples", "total")

    def __init__(self) -> None:
        self.samples: list[list[float]] = []
        self.count = 0
        self.total = 0.0

    def record(self, value: float, now: float) -> None:
        self.count += 1
        self.total += value
        samples = self.samples
        if not samples or now - samples[-1][0] >= WINDOW:
            samples.append([now, 0, 0.0, float("-inf")])
            if len(samples) > SAMPLES:
                del samples[0]
        sample = samples[-1]
        sample[1] += 1
        sample[2] += value
        if value > sample[3]:
            sample[3] = value

    def _live(self, now: float) -> list[list[float]]:
        return [s for s in self.samples if now - s[0] < WINDOW * SAMPLES]

    def rate(self, now: float) -> float:
        live = self._live(now)
        if not live:
            return 0.0
        elapsed = max(now - live[0][0], WINDOW * (SAMPLES - 1), 1e-9)
        return sum(s[2] for s in live) / elapsed

    def avg(self, now: float) -> float:
        live = self._live(now)
        count = sum(s[1] for s in live)
        return sum(s[2] for s in live) / count if count else 0.0

    def max(self, now: float) -> float:
        live = self._live(now)
        return max((s[3] for s in live), default=0.0)


class _Metrics:
    """A lock, named stats and a snapshot; the sender's thread records, any thread reads."""

    kind = ""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()

    def snapshot(self) -> dict[str, float]:
        raise NotImplementedError

    def stats_json(self, client_id: str) -> str:
        """What a stats_cb gets, as librdkafka hands it: a JSON document."""
        return json.dumps({"name": client_id, "client_id": client_id, "type": self.kind,
                           "ts": int(time.time() * 1000), "metrics": self.snapshot()},
                          sort_keys=True)


class ProducerMetrics(_Metrics):
    kind = "producer"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self.sent = Stat()        # records per batch sent
        self.retried = Stat()     # records per batch sent again
        self.errors = Stat()      # records per batch failed or refused as duplicates
        self.duplicates = Stat()  # records per batch refused as duplicates
        self.batch_bytes = Stat()
        self.request_records = Stat()
        self.latency = Stat()     # ms per Produce request
        self.epoch_bumps = 0

    def batch_sent(self, records: int, size: int, retry: bool) -> None:
        now = self.clock()
        with self.lock:
            self.sent.record(records, now)
            self.batch_bytes.record(size, now)
            if retry:
                self.retried.record(records, now)

    def request_sent(self, records: int) -> None:
        with self.lock:
            self.request_records.record(records, self.clock())

    def request_answered(self, latency: float) -> None:
        with self.lock:
            self.latency.record(latency * 1000, self.clock())

    def batch_failed(self, records: int) -> None:
        with self.lock:
            self.errors.record(records, self.clock())

    def duplicate(self, records: int) -> None:
        now = self.clock()
        with self.lock:
            self.errors.record(records, now)
            self.duplicates.record(records, now)

    def epoch_bumped(self) -> None:
        with self.lock:
            self.epoch_bumps += 1

    def snapshot(self) -> dict[str, float]:
        now = self.clock()
        with self.lock:
            return {
                "record-send-rate": self.sent.rate(now),
                "record-send-total": self.sent.total,
                "record-retry-rate": self.retried.rate(now),
                "record-retry-total": self.retried.total,
                "record-error-rate": self.errors.rate(now),
                "record-error-total": self.errors.total,
                "record-duplicate-rate": self.duplicates.rate(now),
                "record-duplicate-total": self.duplicates.total,
                "batch-size-avg": self.batch_bytes.avg(now),
                "batch-size-max": self.batch_bytes.max(now),
                "records-per-request-avg": self.request_records.avg(now),
                "request-rate": self._request_rate(now),
                "request-total": self.latency.count,
                "request-latency-avg": self.latency.avg(now),
                "request-latency-max": self.latency.max(now),
                "epoch-bump-total": self.epoch_bumps,
            }

    def _request_rate(self, now: float) -> float:
        live = self.latency._live(now)
        if not live:
            return 0.0
        return sum(s[1] for s in live) / max(now - live[0][0], WINDOW * (SAMPLES - 1))


class ConsumerMetrics(_Metrics):
    kind = "consumer"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self.records = Stat()     # records per fetch answer
        self.bytes = Stat()       # bytes per fetch answer
        self.latency = Stat()     # ms per Fetch
        self.lags: dict[tuple[str, int], int] = {}

    def fetched(self, latency: float, records: int, size: int) -> None:
        now = self.clock()
        with self.lock:
            self.latency.record(latency * 1000, now)
            self.records.record(records, now)
            self.bytes.record(size, now)

    def lag(self, tp: tuple[str, int], lag: int) -> None:
        with self.lock:
            self.lags[tp] = max(0, lag)

    def forget(self, tp: tuple[str, int]) -> None:
        with self.lock:
            self.lags.pop(tp, None)

    def snapshot(self) -> dict[str, float]:
        now = self.clock()
        with self.lock:
            fetches = self.latency._live(now)
            span = max(now - fetches[0][0], WINDOW * (SAMPLES - 1)) if fetches else 1.0
            return {
                "records-consumed-rate": self.records.rate(now),
                "records-consumed-total": self.records.total,
                "bytes-consumed-rate": self.bytes.rate(now),
                "bytes-consumed-total": self.bytes.total,
                "fetch-rate": sum(s[1] for s in fetches) / span if fetches else 0.0,
                "fetch-total": self.latency.count,
                "fetch-latency-avg": self.latency.avg(now),
                "fetch-latency-max": self.latency.max(now),
                "request-latency-avg": self.latency.avg(now),
                "request-latency-max": self.latency.max(now),
                "records-lag-max": max(self.lags.values(), default=0),
                "records-per-request-avg": self.records.avg(now),
            }


class StatsTimer:
    """Calls ``stats_cb(json)`` every ``statistics.interval.ms`` (0: never), from whoever
    calls ``maybe_emit`` (the consumer's poll) or from a loop's timer (the producer)."""

    def __init__(self, metrics: _Metrics, client_id: str, interval_ms: int,
                 callback: Callable[[str], object] | None) -> None:
        self.metrics = metrics
        self.client_id = client_id
        self.interval = interval_ms / 1000
        self.callback = callback
        self.due = metrics.clock() + self.interval

    @property
    def enabled(self) -> bool:
        return self.callback is not None and self.interval > 0

    def maybe_emit(self) -> None:
        if not self.enabled:
            return
        now = self.metrics.clock()
        if now < self.due:
            return
        self.due = now + self.interval
        self.emit()

    def emit(self) -> None:
        assert self.callback is not None
        try:
            self.callback(self.metrics.stats_json(self.client_id))
        except Exception:  # a user's callback must not stop the client
            log.exception("stats_cb raised")
