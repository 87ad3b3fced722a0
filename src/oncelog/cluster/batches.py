"""Many partitions' conditional writes in few ZooKeeper transactions.

Every partition state change is a conditional write (the znode at the version its writer
read; the controller's also at its epoch). One round trip each made a broker with 1,000
partitions take minutes to shut down or rejoin the ISRs (docs/benchmarks.md); ZooKeeper's
multi takes many of them in one request, all or none. ``settle`` writes items (one
partition's change each) in transactions of at most BATCH_ITEMS, and keeps each item's own
fate: a transaction fails whole when one of its conditions fails, so the items whose ops
were only rolled back (``RolledBackError`` before the failing op, ``RuntimeInconsistency``
after it) are written again without the items that failed; those keep their error (their
znode moved on: the writer reads it again and decides anew). Each retry holds fewer items, so
an item is written at most as many times as its transaction had items that failed.

Reads go the same way: ``gather`` sends many reads before waiting for the first answer, at
most GATHER_CHUNK at a time. kazoo sends a session's requests in order, one by one from its
connection thread, so 3,000 reads queued at once (a replica watch's, a metadata cache's
after a controller wrote 1,000 states) held the heartbeat behind them for seconds in a
loaded broker, and the broker, hearing nothing from ZooKeeper for half its session timeout,
fenced its own leaderships (membership.py's V3; seen in bench/cluster_control.py's 1,000
partitions). In chunks the heartbeat waits behind one chunk per reader, and every chunk
answered tells the store when ZooKeeper last heard from the session.

Decisions stay where they are (isr.py, leader_election.py): this is only how their writes
travel.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from kazoo.exceptions import (
    AuthFailedError,
    ConnectionLoss,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)

from ..metadata.store import MetadataUnavailable

T = TypeVar("T")

BATCH_ITEMS = 200  # partitions per transaction: well under ZooKeeper's 1 MB request bound
GATHER_CHUNK = 100  # reads in flight at once: a round trip per 100 reads, little queued


def rolled_back(result: object) -> bool:
    return isinstance(result, (RolledBackError, RuntimeInconsistency))


def outcome(results: Sequence[object]) -> object:
    """One item's fate from its ops' results: the error that failed it, else
    RolledBackError when only rolled back, else its last op's result."""
    failed = [r for r in results if isinstance(r, Exception) and not rolled_back(r)]
    if failed:
        return failed[0]
    rolled = [r for r in results if isinstance(r, Exception)]
    return rolled[0] if rolled else results[-1]


def settle(items: Sequence[T], commit: Callable[[list[T]], list[object]],
           batch: int | None = None) -> list[object]:
    """Each item's fate (aligned with ``items``): ``commit`` writes a list of items in one
    transaction and answers each one's ``outcome``; an exception it raises (ZooKeeper away,
    the controller moved) goes to the caller."""
    batch = batch or BATCH_ITEMS
    fates: list[object] = [None] * len(items)
    for start in range(0, len(items), batch):
        pending = list(range(start, min(start + batch, len(items))))
        while pending:
            answers = commit([items[i] for i in pending])
            retry = [i for i, answer in zip(pending, answers, strict=True)
                     if rolled_back(answer)]
            for i, answer in zip(pending, answers, strict=True):
                fates[i] = answer
            if len(retry) == len(pending):  # nothing of ours failed it: not ours to retry
                break
            pending = retry
    return fates


def gather(store, calls: Sequence[Callable[[], object]]) -> list[object]:
    """Issue the calls (each a kazoo ``*_async``) GATHER_CHUNK at a time, waiting for each
    chunk's answers: a round trip per chunk. Each answer is the value or the exception;
    ZooKeeper not answering in time, or the connection lost under the reads:
    MetadataUnavailable."""
    out: list[object] = []
    for start in range(0, len(calls), GATHER_CHUNK):
        sent = time.monotonic()
        pending = [call() for call in calls[start:start + GATHER_CHUNK]]
        answered = len(out)
        for result in pending:
            try:
                out.append(result.get(timeout=store.session_timeout_ms / 1000))
            except store.client.handler.timeout_exception:
                raise MetadataUnavailable("ZooKeeper did not answer in time") from None
            except (ConnectionLoss, SessionExpiredError) as exc:
                raise MetadataUnavailable(f"ZooKeeper connection lost: {exc!r}") from None
            except Exception as exc:  # an answer all the same (NoNode, ...)
                out.append(exc)
        # kazoo answers AuthFailedError itself, without a request: not word from ZooKeeper
        if any(not isinstance(a, AuthFailedError) for a in out[answered:]):
            store.heard(sent)
    return out
