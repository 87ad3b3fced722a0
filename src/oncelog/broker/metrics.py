"""Counters for operators, in Prometheus' text format, on a listener of their own.

``metrics.listener`` (``host:port``; empty, the default: not served) is an HTTP listener
apart from the Kafka port, as Kafka's JMX and Prometheus exporters are: the Kafka port
answers Kafka only, and an operator chooses who can reach the metrics (a loopback or
management address). A scrape is rendered in a worker thread, one at a time (scrapes that
arrive meanwhile share that rendering), so that the event loop keeps serving clients; the
renderer only copies the broker's collections in single steps (``list(...)``) and reads
numbers. Per-partition and per-group metrics keep at most ``metrics.partition.series.max``
and GROUP_SERIES_LIMIT series (the largest values), and say how many they left out.

The seeds name what operators watch (``record-error-rate``, ``ErrorsPerSec``): here, per
partition, every produce outcome (appended, duplicate, each error) and the producers held;
for the broker, its connections and the request memory they hold (backpressure); per
consumer group, its members and each committed partition's lag; transactional ids per state
and the age of the oldest open transaction.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import logging
from collections import Counter

from ..coordinator.transaction.txn_records import TxnState
from .log_limits import RateLimitedLog
from .replication_metrics import lines as replication_lines

log = logging.getLogger(__name__)
_refused = RateLimitedLog(log)

_MAX_HEADER = 16 * 1024
_READ_TIMEOUT_S = 10.0
_MAX_CONNECTIONS = 16  # scrapers at once; more are closed at once


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(broker) -> str:
    """The whole text; runs in the metrics thread (see the module's text)."""
    limit = broker.config.get("metrics.partition.series.max")
    counted = list(broker.counters.snapshot().items())
    totals = [(sum(outcomes.values()), tp) for tp, outcomes in counted]
    omitted = {"produce_batches": max(0, len(totals) - limit)}
    kept = {tp for _, tp in heapq.nlargest(limit, totals)}
    lines = [
        "# HELP oncelog_produce_batches_total Produce batches per partition by outcome.",
        "# TYPE oncelog_produce_batches_total counter",
    ]
    for (topic, partition), outcomes in sorted(kv for kv in counted if kv[0] in kept):
        for outcome, count in sorted(outcomes.items()):
            lines.append(f'oncelog_produce_batches_total{{topic="{_label(topic)}",'
                         f'partition="{partition}",outcome="{_label(outcome)}"}} {count}')
    held = [(len(p.state), p.state.tombstone_count, p.topic, p.index)
            for p in _open_partitions(broker)]
    omitted["producers"] = max(0, len(held) - limit)
    held = sorted(heapq.nlargest(limit, held), key=lambda h: h[2:])
    lines += [
        "# HELP oncelog_producers Idempotent producers held in memory per partition.",
        "# TYPE oncelog_producers gauge",
    ]
    tombstones = ["# HELP oncelog_producer_records Compact records of expired or evicted "
                  "producers per partition.", "# TYPE oncelog_producer_records gauge"]
    for producers, records, topic, index in held:
        labels = f'topic="{_label(topic)}",partition="{index}"'
        lines.append(f"oncelog_producers{{{labels}}} {producers}")
        tombstones.append(f"oncelog_producer_records{{{labels}}} {records}")
    tombstones += [f"# HELP oncelog_partition_series_omitted Series left out of a "
                   f"per-partition metric beyond the {limit:,} largest.",
                   "# TYPE oncelog_partition_series_omitted gauge"]
    tombstones += [f'oncelog_partition_series_omitted{{metric="{m}"}} {n}'
                   for m, n in omitted.items()]
    log_dirs = ["# HELP oncelog_log_dir_offline 1 when the log directory failed and is offline "
                "until a restart.", "# TYPE oncelog_log_dir_offline gauge"]
    log_dirs += [f'oncelog_log_dir_offline{{path="{_label(path)}"}} {int(state.offline)}'
                 for path, state in list(broker.topics.log_dirs.items())]
    return "\n".join(lines + tombstones + log_dirs + _cleaner(broker) + _network(broker)
                     + _groups(broker) + _transactions(broker)
                     + replication_lines(broker)) + "\n"


def _open_partitions(broker):
    for topic in list(broker.topics.topics.values()):
        for partition in list(topic.partitions):
            if partition.is_open:
                yield partition


_CLEANER = (  # (name, CleanerStats field, type, help), Kafka's LogCleaner metrics in spirit
    ("oncelog_log_cleaner_runs_total", "runs", "counter", "Logs cleaned (compacted)."),
    ("oncelog_log_cleaner_failures_total", "failures", "counter",
     "Cleans that failed and left the log as it was."),
    ("oncelog_log_cleaner_read_bytes_total", "bytes_read", "counter",
     "Bytes of segments cleaned (read and rewritten)."),
    ("oncelog_log_cleaner_written_bytes_total", "bytes_written", "counter",
     "Bytes of the cleaned segments written in their place."),
    ("oncelog_log_cleaner_removed_records_total", "records_removed", "counter",
     "Records removed by compaction (superseded, expired tombstones, keyless)."),
    ("oncelog_log_cleaner_last_clean_seconds", "last_clean_seconds", "gauge",
     "How long the last clean took."),
    ("oncelog_log_cleaner_max_dirty_ratio", "max_dirty_ratio", "gauge",
     "The highest dirty ratio among compacted logs when the cleaner last looked."),
    ("oncelog_log_cleaner_uncleanable_partitions", "uncleanable", "gauge",
     "Partitions left alone until a restart because their data does not read back."),
)


def _cleaner(broker) -> list[str]:
    stats = broker.log_cleaner.stats
    lines = []
    for name, field, kind, text in _CLEANER:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}",
                  f"{name} {getattr(stats, field)}"]
    return lines


# Each per-group metric keeps at most this many series (the largest values), so that a broker
# with very many groups still answers a scrape quickly; how many were left out is reported.
GROUP_SERIES_LIMIT = 10_000
# Classic groups' states, then those only KIP-848 groups have.
_GROUP_STATES = ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead",
                 "Assigning", "Reconciling")


def _groups(broker) -> list[str]:
    """Read from the coordinator (classic and KIP-848 groups alike): groups per state,
    members per group, and the lag of every committed offset whose partition is open (log
    end offset - committed offset). A partition nobody has produced to or read since the
    broker started is not opened for a scrape: its lag appears once it is."""
    states: Counter[str] = Counter()
    members: list[tuple[int, str]] = []
    lags: list[tuple[int, str, str, int]] = []
    for group in list(broker.groups.groups.values()):
        states[group.state.value] += 1
        count = group.member_count()  # read once, and no mapping made for it
        if count:
            members.append((count, group.group_id))
        for (topic, index), committed in list(group.offsets.items()):
            partition = broker.topics.partition(topic, index)
            if partition is not None and partition.is_open:
                lag = max(0, partition.high_watermark - committed.offset)
                lags.append((lag, group.group_id, topic, index))
    omitted = {"members": max(0, len(members) - GROUP_SERIES_LIMIT),
               "lag": max(0, len(lags) - GROUP_SERIES_LIMIT)}
    if omitted["members"]:
        members = heapq.nlargest(GROUP_SERIES_LIMIT, members)
    if omitted["lag"]:
        lags = heapq.nlargest(GROUP_SERIES_LIMIT, lags)
    lines = ["# HELP oncelog_consumer_groups Consumer groups by state.",
             "# TYPE oncelog_consumer_groups gauge"]
    lines += [f'oncelog_consumer_groups{{state="{s}"}} {states[s]}' for s in _GROUP_STATES]
    lines += ["# HELP oncelog_consumer_group_members Members of each group that has any.",
              "# TYPE oncelog_consumer_group_members gauge"]
    lines += [f'oncelog_consumer_group_members{{group="{_label(g)}"}} {n}'
              for n, g in sorted(members, key=lambda m: m[1])]
    lines += ["# HELP oncelog_consumer_group_lag Log end offset minus the group's committed "
              "offset, per partition.", "# TYPE oncelog_consumer_group_lag gauge"]
    lines += [f'oncelog_consumer_group_lag{{group="{_label(g)}",topic="{_label(t)}",'
              f'partition="{p}"}} {lag}'
              for lag, g, t, p in sorted(lags, key=lambda item: item[1:])]
    lines += [f"# HELP oncelog_consumer_group_series_omitted Series left out of a per-group "
              f"metric beyond the {GROUP_SERIES_LIMIT:,} largest.",
              "# TYPE oncelog_consumer_group_series_omitted gauge"]
    lines += [f'oncelog_consumer_group_series_omitted{{metric="{m}"}} {n}'
              for m, n in omitted.items()]
    return lines


# The states in which a transaction is open: its partitions' LSO waits for its markers.
_OPEN_TXN_STATES = (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT,
                    TxnState.PREPARE_EPOCH_FENCE)


def _transactions(broker) -> list[str]:
    """Read from the transaction coordinator: transactional ids per state, and how long the
    oldest open transaction has been open (0 when none is), the number to alert on when a
    producer hangs or a marker cannot be written."""
    coordinator = broker.transactions
    states: Counter[TxnState] = Counter()
    oldest = None
    for meta in list(coordinator.txns.values()):
        states[meta.state] += 1
        if meta.state in _OPEN_TXN_STATES and meta.start_ms >= 0:
            oldest = meta.start_ms if oldest is None else min(oldest, meta.start_ms)
    age = 0 if oldest is None else max(0, coordinator.now_ms() - oldest)
    lines = ["# HELP oncelog_transactions Transactional ids by the state of their "
             "transaction.", "# TYPE oncelog_transactions gauge"]
    lines += [f'oncelog_transactions{{state="{s.label}"}} {states[s]}' for s in TxnState]
    lines += ["# HELP oncelog_transaction_oldest_open_age_ms Milliseconds since the oldest "
              "open transaction began (0: none open).",
              "# TYPE oncelog_transaction_oldest_open_age_ms gauge",
              f"oncelog_transaction_oldest_open_age_ms {age}"]
    return lines


_NETWORK = (  # (name, stats key, type, help)
    ("oncelog_connections", "connections", "gauge", "Open client connections."),
    ("oncelog_queued_requests", "queued_requests", "gauge",
     "Requests read and waiting only for a handler (queued.max.requests bounds it)."),
    ("oncelog_queued_request_bytes", "queued_request_bytes", "gauge",
     "Bytes of requests read, or being read, and not yet handled (queued.max.request.bytes "
     "bounds it)."),
    ("oncelog_unsent_response_bytes", "unsent_response_bytes", "gauge",
     "Answer bytes written and not yet taken by the kernel, over all connections."),
    ("oncelog_connections_waiting_for_reader", "waiting_answers_unread", "gauge",
     "Connections neither reading nor handling because their peer does not read its answers."),
    ("oncelog_connections_waiting_for_budget", "waiting_request_budget", "gauge",
     "Connections not reading until the request budget has room for them."),
    ("oncelog_request_budget_refusals_total", "request_budget_refusals", "counter",
     "Frames left unread because the request budget was full or others waited first."),
    ("oncelog_write_pauses_total", "write_pauses", "counter",
     "Times a connection stopped because its unread answers passed the high-water mark."),
    ("oncelog_throttled_answers_total", "throttled_answers", "counter",
     "Answers that carried a client quota's throttle_time_ms (their connection then muted)."),
    ("oncelog_connections_throttled", "connections_throttled", "gauge",
     "Connections muted for a client quota's throttle time."),
    ("oncelog_connections_refused_total", "connections_refused", "counter",
     "Connections closed at accept for max.connections or max.connections.per.ip."),
    ("oncelog_connections_delayed_total", "connections_delayed", "counter",
     "Connections served late for max.connection.creation.rate (broker or listener)."),
    ("oncelog_fetch_zero_copy_bytes_total", "zero_copy_bytes", "counter",
     "Record bytes Fetch answers sent from segment files with sendfile (never read in)."),
)


def _network(broker) -> list[str]:
    stats = broker.network_stats()
    lines = []
    for name, key, kind, text in _NETWORK:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {stats[key]}"]
    return lines


class MetricsServer:
    """The HTTP listener of ``metrics.listener``: GET or HEAD of /metrics (or /)."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self._server: asyncio.base_events.Server | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="metrics")
        self._rendering: asyncio.Future | None = None
        self._connections = 0

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, host, port,
                                                  reuse_address=True, limit=_MAX_HEADER)
        return self._server.sockets[0].getsockname()[:2]

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _render(self) -> str:
        """One rendering at a time in the worker thread; scrapes that come meanwhile share
        it."""
        if self._rendering is None:
            loop = asyncio.get_running_loop()
            self._rendering = loop.run_in_executor(self._pool, render, self.broker)
            self._rendering.add_done_callback(lambda _: setattr(self, "_rendering", None))
        return await asyncio.shield(self._rendering)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        try:
            if self._connections > _MAX_CONNECTIONS:
                _refused.log(logging.WARNING, "too many scrapers", "metrics: more than %d "
                             "scrapers at once; closing the connection", _MAX_CONNECTIONS)
                return
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"),
                                              _READ_TIMEOUT_S)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    ConnectionError):
                return
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(parts) >= 2 and parts[0] in ("GET", "HEAD") and \
                    parts[1] in ("/metrics", "/"):
                status, body = "200 OK", (await self._render()).encode()
            else:
                status, body = "404 Not Found", b"only GET /metrics is served here\n"
            answer = (f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                      f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
            writer.write(answer if parts and parts[0] == "HEAD" else answer + body)
            await asyncio.wait_for(writer.drain(), _READ_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            pass
        except asyncio.CancelledError:
            # The broker stopping with a scrape open: the loop's end cancels this task, and
            # Python 3.11's StreamReaderProtocol then asks the cancelled task for its
            # exception, which raises into asyncio's handler and logs a traceback. Ended
            # here, the task is done, not cancelled: nothing is left to run for it.
            return
        except Exception:
            log.exception("metrics: a scrape failed")
        finally:
            self._connections -= 1
            writer.close()
