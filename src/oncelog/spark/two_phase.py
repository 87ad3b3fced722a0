"""Exactly-once writes from Spark: every task writes in its own transaction and prepares it
(two-phase commit, KIP-939); the driver decides, durably, and then commits the prepared
transactions. Every decision about the sink's transactions lives in this file.

Names. ``P`` is the prefix: option ``transactionalIdPrefix``, or by default one per save()
for a batch write (``oncelog-spark-<topic>-<random>``, chosen on the driver when Spark asks
for a writer) and one per streaming query (``oncelog-spark-stream-<query id>``: the query id
persists in the checkpoint, and the tasks read it from Spark's local property
``sql.streaming.queryId``). ``R`` is a random run id (8 hex digits) chosen on the driver when
Spark asks for a writer (once for a batch write, once per micro-batch for a stream):

| transactional id        | who uses it                      | what it holds                   |
|-------------------------|----------------------------------|---------------------------------|
| ``P``                   | the driver                       | the decisions (below); opening  |
|                         |                                  | it fences an older driver of P  |
| ``P-R-p-t``             | the task attempt t (Spark's task | that attempt's rows, prepared,  |
|                         | attempt id, unique in the app)   | never committed by the task     |
|                         | writing partition p              |                                 |

The task ids of P are found by ListTransactions with an anchored pattern of exactly that
shape (``_pattern``): the ids of a prefix ``orders`` are never those of ``orders-eu``.

A decision is an offset of the consumer group ``P``, committed in a transaction of ``P``
(send_offsets_to_transaction), so it is written whole or not at all: its metadata names the
run, the micro-batch (-1 for a batch write), the streaming query (none for a batch write) and
the winners, the transactional ids whose commit messages reached the driver's ``commit()``.
Its offset is the micro-batch + 1.

Who aborts and who commits what, when:

| when                                  | who            | does                                 |
|---------------------------------------|----------------|--------------------------------------|
| a task's write raises                 | the task       | aborts its own transaction           |
| a task prepared, and a decision of    | the task       | aborts its own transaction (an       |
| its run without it exists             |                | attempt the driver could not see)    |
| Spark asks for a batch writer (before | the driver     | opens ``P`` (fails naming            |
| any task runs)                        | (``recover``)  | transaction.two.phase.commit.enable  |
|                                       |                | if the broker refuses 2PC); every    |
|                                       |                | open ``P-*`` a decision names is     |
|                                       |                | finished, every other one aborted    |
| Spark asks for a stream writer        | the driver     | checks that the broker allows 2PC    |
| ``commit()`` of a batch write         | the driver     | checks that every winner still holds |
|                                       |                | its prepared transaction (else, as   |
|                                       |                | another driver of P ended one, fails |
|                                       |                | aborting the run), writes the        |
|                                       |                | decision, then finishes              |
|                                       |                | its winners, then aborts every other |
|                                       |                | open ``P-R-*`` (retried, speculative |
|                                       |                | and killed attempts)                 |
| ``commit()`` of a stream's batch N    | the driver     | refuses (raises, aborting its run)   |
|                                       |                | when a decision of another query or  |
|                                       |                | of a batch write is stored under P;  |
|                                       |                | then ``recover`` but for N's winners |
|                                       |                | (one batch of a query runs at a      |
|                                       |                | time: the rest are leftovers); when  |
|                                       |                | the query decided N already (the     |
|                                       |                | sink committed N, Spark died before  |
|                                       |                | its checkpoint), aborts this run of  |
|                                       |                | N; else as a batch write             |
| ``abort()``                           | the driver     | when a decision names the run (its   |
|                                       |                | commit() failed after deciding):     |
|                                       |                | finishes its winners (roll forward), |
|                                       |                | aborts the rest of the run; else     |
|                                       |                | aborts every open ``P-R-*``          |
| ``oncelog spark recover --prefix P``  | an operator    | ``recover``: a dead driver's run     |

Finishing a winner, the one way this sink commits: EndTxn with the producer id and epoch it
was prepared with, if known; whatever that answers, the winner counts as committed only when
its coordinator says so (DescribeTransactions: PrepareCommit or CompleteCommit; a task id
holds one transaction only, so that is the prepared one). One still open (Ongoing) is kept
by a new instance of its id (keep_prepared_txn) and committed with EndTxn at the new epoch.
One aborted, or whose state proves nothing (another driver of P ended it), fails the commit
loudly, naming P: its rows are lost and the job must not report success. A coordinator that
fails is asked again, ``FINISH_ATTEMPTS`` times; when it still fails the commit raises and
Spark calls ``abort()``, which finishes the run (never aborts a decided run's winners), as
does any later ``recover`` of P (Flink's KafkaSink retries a durable commit the same way).

The driver ends others' transactions without a producer for each: EndTxn with the id and
epoch a winner prepared, or InitProducerId as a new instance of the id (which aborts what is
open, or with keep_prepared_txn keeps it for an EndTxn at the new epoch), pipelined on one
connection per coordinator (``Admin.end_transactions``, ``Admin.fence_transactions``).

Why it is exactly once. Before the decision nothing of the run is visible, and the next
``recover`` (or ``abort()``) aborts all of it: a job that dies before ``commit()`` is run
again from nothing. After the decision the run is committed even if the driver dies halfway
through the winners: ``abort()`` or ``recover`` finishes them (roll forward), and aborts only
what no decision names. A stream's batch N that its query decided is not written again when
Spark re-runs it, as its checkpoint had not recorded N; ``commit()`` of N+1 comes only after
N, so the stored batch id only grows. Prepared transactions have no timeout (two-phase
commit), so nothing but these rules ends them. One prefix must not be used by two jobs or
queries at the same time (as Flink's transactional id prefix): the second's ``recover`` ends
the first's work, and the first then fails (its decide is fenced, or its winners are found
aborted) instead of reporting success.

What a job cannot know: a driver that dies after its decision was written leaves a
committed run (finished by ``oncelog spark recover`` or the next ``recover`` of a given
prefix); running that job again writes it again. What stays open until a commit, abort or
recover of P: a task attempt that Spark kills while it is still writing, after the driver's
last listing (a speculative copy that outlives its job), and the prepared transactions of a
driver killed before its decision and never run again: read_committed readers of their
partitions wait at their first record until then. The broker logs such transactions once
they are older than transaction.max.timeout.ms, ``oncelog transactions find-prepared`` lists
them with their prefix, and ``oncelog spark recover --prefix P`` ends them.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
import zlib
from base64 import b64decode, b64encode
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ..client.admin.admin import Admin
from ..client.network.connection import KafkaError
from ..client.producer.producer import Producer
from ..client.producer.transactions import PreparedTxnState
from ..client.topic_partition import OffsetAndMetadata
from .options import DEFAULT_PREFIX, OptionError, WriteOptions

log = logging.getLogger(__name__)

TIMEOUT = 120.0  # seconds for each coordinator step (init, prepare, commit, abort)
NO_BATCH = -1  # a decision of a batch write
_METADATA_LIMIT = 4000  # offset.metadata.max.bytes is 4096 by default
TWO_PHASE_KEY = "transaction.two.phase.commit.enable"
# Tries at finishing a decided run's winners before commit() gives up (abort() or the next
# recover finish them), with a backoff doubling from FINISH_BACKOFF seconds.
FINISH_ATTEMPTS = 5
FINISH_BACKOFF = 0.5
# What the tasks of a streaming query read to name their prefix (StreamExecution sets it).
QUERY_ID = "sql.streaming.queryId"
# An id no task or driver uses: opened only to learn whether the broker allows 2PC.
_CHECK_ID = f"{DEFAULT_PREFIX}-two-phase-check"
_RUN = re.compile(r"[0-9a-f]{8}")
# A task's transactional id after "P-": run, partition, task attempt id.
_TASK_TAIL = r"-[0-9a-f]{8}-[0-9]+-[0-9]+"
_COMMITTED = ("PrepareCommit", "CompleteCommit")


def new_run() -> str:
    return secrets.token_hex(4)


def stream_prefix(query_id: str) -> str:
    """The default prefix of a streaming query: its id, which its checkpoint keeps."""
    return f"{DEFAULT_PREFIX}-stream-{re.sub(r'[^A-Za-z0-9._-]', '_', query_id)}"


def task_transactional_id(prefix: str, run: str, partition: int, attempt_id: int) -> str:
    return f"{prefix}-{run}-{partition}-{attempt_id}"


def prefix_of(transactional_id: str) -> str | None:
    """The prefix of a task's transactional id (None: not one of this sink's)."""
    found = re.fullmatch(r"(.+)" + _TASK_TAIL, transactional_id)
    return found.group(1) if found else None


def _escape(text: str) -> str:
    """Escapes that RE2 (the broker's, Kafka's RE2/J) and Java's regexes read alike."""
    return re.sub(r"[^A-Za-z0-9_-]", lambda m: "\\" + m.group(), text)


def _pattern(prefix: str, run: str | None = None) -> str:
    """ListTransactions' filter for the task ids of ``prefix`` (of ``run``): anchored and of
    exactly their shape, so that the ids of another prefix never match (``orders`` against
    ``orders-eu-...``, ``oncelog-spark-stream`` against every stream's)."""
    if run is None:
        return f"^{_escape(prefix)}{_TASK_TAIL}$"
    if not _RUN.fullmatch(run):
        raise ValueError(f"not a run id: {run!r}")
    return f"^{_escape(prefix)}-{run}-[0-9]+-[0-9]+$"


@dataclass(frozen=True)
class Decision:
    run: str
    batch: int  # the micro-batch; NO_BATCH for a batch write
    winners: frozenset[str]  # transactional ids to commit
    query: str | None = None  # the streaming query; None for a batch write

    def metadata(self) -> str:
        fields = {"run": self.run, "batch": self.batch, "winners": sorted(self.winners)}
        if self.query is not None:
            fields["query"] = self.query
        text = json.dumps(fields, separators=(",", ":"))
        if len(text) > _METADATA_LIMIT:
            text = "z:" + b64encode(zlib.compress(text.encode(), 9)).decode()
        if len(text) > _METADATA_LIMIT:
            raise ValueError(f"the commit decision of {len(self.winners)} tasks does not fit "
                             "in a group offset's metadata: write with fewer partitions")
        return text

    @classmethod
    def parse(cls, text: str | None) -> Decision | None:
        if not text:
            return None
        try:
            if text.startswith("z:"):
                text = zlib.decompress(b64decode(text[2:])).decode()
            data = json.loads(text)
            query = data.get("query")
            return cls(str(data["run"]), int(data["batch"]), frozenset(data["winners"]),
                       None if query is None else str(query))
        except (ValueError, KeyError, TypeError, AttributeError, zlib.error):
            return None  # not a decision of this sink


class WinnersLost(RuntimeError):
    """A decided run's winner that is not committed and never will be: someone else (another
    job or query using the prefix, or an operator's recover) aborted it."""


class Unfinished(RuntimeError):
    """A decided run whose winners could not all be committed yet (the coordinator kept
    failing): abort() or the next recover of the prefix finishes them."""


class PrefixInUse(RuntimeError):
    """A streaming query's prefix holds another query's (or a batch write's) decisions."""


def _transactional(options: WriteOptions, transactional_id: str) -> dict[str, str]:
    return {**options.producer, "transactional.id": transactional_id,
            TWO_PHASE_KEY: "true"}


class TaskTransaction:
    """One task attempt's transaction: begun on the first row, prepared at the end."""

    def __init__(self, options: WriteOptions, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.producer = Producer(_transactional(options, transactional_id))
        self.producer.init_transactions(TIMEOUT)
        self.producer.begin_transaction()

    def prepare(self) -> str:
        return str(self.producer.prepare_transaction(TIMEOUT))

    def abort(self) -> None:
        try:
            self.producer.abort_transaction(TIMEOUT)
        except Exception as exc:  # the driver's abort or the next recover ends it then
            log.warning("%s: the abort failed: %s", self.transactional_id, exc)

    def close(self) -> None:
        self.producer.close(TIMEOUT)


def run_task(options: WriteOptions, prefix: str, run: str, transactional_id: str,
             produce: Callable[[Producer], int]) -> str:
    """A task attempt: ``produce`` (its rows, in the attempt's transaction; returns how
    many) then prepare; the prepared state ("id:epoch") for the driver. A failure aborts the
    transaction, and so does a decision of ``run`` made without this attempt."""
    txn = TaskTransaction(options, transactional_id)
    try:
        records = produce(txn.producer)
        prepared = txn.prepare()
        if records and decided_without(options, prefix, run, transactional_id):
            raise RuntimeError(f"{transactional_id}: another attempt of this task was "
                               "committed already; this one is aborted")
        return prepared
    except BaseException:
        txn.abort()
        raise
    finally:
        txn.close()


def decided_without(options: WriteOptions, prefix: str, run: str,
                    transactional_id: str) -> bool:
    """Whether the driver decided ``run`` already, without this task attempt (a retried or
    speculative copy of it won): read after the attempt prepared, so that an attempt the
    driver's last listing could not see ends its transaction itself. The run alone says
    which: it is new for every micro-batch."""
    with Admin(options.admin_config()) as admin:
        return any(d.run == run and transactional_id not in d.winners
                   for d in _decisions(admin, prefix))


def _decisions(admin: Admin, prefix: str) -> list[Decision]:
    try:
        offsets = admin.list_group_offsets(prefix)
    except KafkaError as exc:
        if exc.error.name.upper() == "GROUP_ID_NOT_FOUND":
            return []
        raise
    found = (Decision.parse(committed.metadata) for committed in offsets.values())
    return [d for d in found if d is not None]


class Driver:
    """The driver's part: opening ``P``, the decisions, committing and aborting others'
    transactions. ``with Driver(options, P) as d:``."""

    def __init__(self, options: WriteOptions, prefix: str | None = None,
                 decides: bool = False) -> None:
        """Opens ``P`` (``prefix``, by default the options'), fencing any older driver of
        it: with a producer of ``P`` when this one ``decides``, else through the admin
        connection alone."""
        self.options = options
        self.prefix = prefix or options.transactional_id_prefix
        assert self.prefix, "a driver needs its prefix"
        self.admin = Admin(options.admin_config())
        self.own: Producer | None = None
        try:
            if decides:
                self.own = Producer(_transactional(options, self.prefix))
                self.own.init_transactions(TIMEOUT)
            else:
                fenced = self.admin.fence_transactions([self.prefix])[self.prefix]
                if isinstance(fenced, KafkaError):
                    raise fenced
        except KafkaError as exc:
            self.close()
            if "AUTHORIZATION" in exc.error.name.upper():
                raise OptionError(TWO_PHASE_KEY, f"the broker refuses two-phase commit "
                                                 f"({exc}); exactly-once writes need "
                                                 f"{TWO_PHASE_KEY}=true in the broker's "
                                                 'settings, or write with option("guarantee",'
                                                 ' "at-least-once")') from None
            raise

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.own is not None:
            self.own.close(TIMEOUT)
        self.admin.close()

    # --- decisions ------------------------------------------------------------------------

    def decisions(self) -> list[Decision]:
        return _decisions(self.admin, self.prefix)

    def decide(self, decision: Decision, topic: str) -> None:
        """Write ``decision`` durably, all or nothing: from here on the run is committed."""
        assert self.own is not None
        self.own.begin_transaction()
        try:
            self.own.send_offsets_to_transaction(
                {(topic, 0): OffsetAndMetadata(decision.batch + 1, decision.metadata())},
                self.prefix, TIMEOUT)
            self.own.commit_transaction(TIMEOUT)
        except BaseException:
            try:
                self.own.abort_transaction(TIMEOUT)
            except Exception as exc:
                log.warning("%s: aborting the decision failed: %s", self.prefix, exc)
            raise

    def check_prepared(self, run: str, winners: Mapping[str, str]) -> None:
        """Before deciding: every winner still holds the transaction it prepared. One that
        another driver of P ended meanwhile (its recover) could never be committed, and a
        decision naming it would make part of the run visible: nothing is decided, and
        the run is aborted whole."""
        gone = []
        for t, d in self.admin.describe_transactions(sorted(winners)).items():
            if isinstance(d, KafkaError):
                if d.error != ErrorCode.transactional_id_not_found:
                    raise d
                gone.append(f"{t} (unknown)")
            elif d.state != "Ongoing" or \
                    d.producer_id != PreparedTxnState.parse(winners[t]).producer_id:
                gone.append(f"{t} ({d.state})")
        if gone:
            self.abort_open(run)
            raise WinnersLost(
                f"{self.prefix}: {len(gone)} of the prepared transactions of this write were "
                f"ended by someone else before its commit: {', '.join(gone)}. Nothing of it "
                f"is written. Another job or query using the transactionalIdPrefix "
                f"{self.prefix!r} (or `oncelog spark recover`) aborted them: one prefix "
                "belongs to one job or query at a time")

    # --- ending others' transactions ----------------------------------------------------

    def open_transactions(self, run: str | None = None) -> list[str]:
        """The task ids of P (of ``run``) with a transaction open."""
        listed = self.admin.list_transactions(states=("Ongoing",),
                                              pattern=_pattern(self.prefix, run))
        return sorted({t.transactional_id for ts in listed.values() for t in ts})

    def finish(self, winners: frozenset[str], prepared: Mapping[str, str] | None = None
               ) -> None:
        """Commit each winner of a decision (``prepared``: id -> "id:epoch" it prepared
        with, where known) and return only once each one's coordinator says it is
        committed. WinnersLost when one was aborted (or ended in a way that proves
        nothing); Unfinished when the coordinators kept failing."""
        left = set(winners)
        problem: object = None
        for attempt in range(FINISH_ATTEMPTS):
            if attempt:
                time.sleep(FINISH_BACKOFF * 2 ** (attempt - 1))
            try:
                left = self._finish_step(left, prepared or {})
            except KafkaError as exc:
                problem = exc
                continue
            if not left:
                return
            problem = f"still open: {', '.join(sorted(left))}"
        raise Unfinished(f"{self.prefix}: the run was decided (committed) but committing "
                         f"its transactions failed {FINISH_ATTEMPTS} times ({problem}); "
                         "Spark's abort() of this write, a later write with this "
                         "transactionalIdPrefix, or `oncelog spark recover --prefix "
                         f"{self.prefix}` finishes it")

    def _finish_step(self, left: set[str], prepared: Mapping[str, str]) -> set[str]:
        """One try at the winners ``left``: those not yet proven committed after it."""
        known = {t: PreparedTxnState.parse(prepared[t]) for t in left if prepared.get(t)}
        if known:
            ended = self.admin.end_transactions(
                {t: (p.producer_id, p.epoch) for t, p in known.items()}, commit=True)
            left = {t for t in left if ended.get(t) != ErrorCode.none}
        if not left:
            return left
        unsure, ongoing, lost = set(), [], []
        for t, d in self.admin.describe_transactions(sorted(left)).items():
            if isinstance(d, KafkaError):
                if d.error == ErrorCode.transactional_id_not_found:
                    lost.append(f"{t} (unknown)")
                else:
                    unsure.add(t)
            elif d.state in _COMMITTED:
                continue
            elif d.state == "Ongoing":
                ongoing.append(t)
            else:
                lost.append(f"{t} ({d.state})")
        if lost:
            raise WinnersLost(
                f"{self.prefix}: the run was decided, but {len(lost)} of its prepared "
                f"transactions were ended by someone else and cannot be committed: "
                f"{', '.join(lost)}. Their rows are aborted (not written). Another job or "
                f"query using the transactionalIdPrefix {self.prefix!r} (or `oncelog spark "
                "recover`) aborted them: one prefix belongs to one job or query at a time")
        kept = {}
        for t, fenced in self.admin.fence_transactions(ongoing, keep_prepared=True).items():
            if isinstance(fenced, KafkaError) or fenced.ongoing_producer_id < 0:
                unsure.add(t)  # ended meanwhile: the next step asks its state again
            else:
                kept[t] = (fenced.producer_id, fenced.epoch)
        for t, error in self.admin.end_transactions(kept, True).items():
            if error == ErrorCode.none:
                log.info("%s: committed the prepared transaction a decision named", t)
            else:
                unsure.add(t)
        return unsure

    def abort(self, transactional_ids: list[str]) -> None:
        """Abort the open transaction of each id (fencing its instances)."""
        for fenced in self.admin.fence_transactions(transactional_ids).values():
            if isinstance(fenced, KafkaError):
                raise fenced

    def abort_open(self, run: str | None = None, keep: frozenset[str] = frozenset()
                   ) -> list[str]:
        """Abort every open task transaction of P (of ``run``) but those in ``keep``."""
        doomed = [t for t in self.open_transactions(run) if t not in keep]
        self.abort(doomed)
        if doomed:
            log.info("%s: aborted %d open transactions: %s", self.prefix, len(doomed),
                     ", ".join(doomed))
        return doomed

    def recover(self, keep: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
        """Finish what a decision committed, abort every other open transaction of P but
        those in ``keep``: (finished, aborted). The decisions are read only when something
        is open: the common case (the last run ended everything) costs one listing."""
        open_ids = self.open_transactions()
        if not open_ids:
            return [], []
        winners = frozenset().union(*(d.winners for d in self.decisions()))
        doomed = [t for t in open_ids if t not in winners and t not in keep]
        self.abort(doomed)
        decided = [t for t in open_ids if t in winners]
        self.finish(frozenset(decided))
        if doomed or decided:
            log.info("%s: recovered: finished %s, aborted %s", self.prefix,
                     ", ".join(decided) or "none", ", ".join(doomed) or "none")
        return decided, doomed

    def roll_forward_or_abort(self, run: str) -> None:
        """Spark's abort() of ``run``: a decided run is finished (its commit() failed after
        the decision), never aborted; an undecided one is aborted whole."""
        decision = next((d for d in self.decisions() if d.run == run), None)
        if decision is None:
            self.abort_open(run)
            return
        log.warning("%s: run %s was decided before its commit failed: finishing it",
                    self.prefix, run)
        self.finish(decision.winners)
        self.abort_open(run, keep=decision.winners)


def commit_run(options: WriteOptions, run: str, winners: dict[str, str],
               topics: set[str]) -> None:
    """The driver's commit() of a batch write's tasks."""
    with Driver(options, decides=True) as driver:
        if winners:
            driver.check_prepared(run, winners)
            driver.decide(Decision(run, NO_BATCH, frozenset(winners)), min(topics))
            driver.finish(frozenset(winners), winners)
        driver.abort_open(run, keep=frozenset(winners))


def abort_run(options: WriteOptions, run: str, prefix: str | None = None) -> None:
    with Driver(options, prefix) as driver:
        driver.roll_forward_or_abort(run)


def commit_micro_batch(options: WriteOptions, prefix: str, query: str | None,
                       run: str | None, batch: int, winners: dict[str, str],
                       topics: set[str]) -> bool:
    """The driver's commit() of a stream's micro-batch ``batch`` of ``query`` (Spark calls
    it with a writer made anew, so ``prefix``, ``query`` and ``run`` come from the tasks'
    messages). One batch of a query runs at a time: every open transaction of P that is
    not this batch's winner is a leftover. False when the query decided ``batch`` already:
    this run of it is aborted."""
    with Driver(options, prefix, decides=True) as driver:
        decisions = driver.decisions()
        foreign = next((d for d in decisions if d.query != query), None)
        if foreign is not None:
            if run is not None:
                driver.abort_open(run)
            owner = f"query {foreign.query}" if foreign.query else "a batch write"
            raise PrefixInUse(
                f"{prefix}: the transactionalIdPrefix holds the decisions of {owner} (its "
                f"micro-batch {foreign.batch}); a prefix belongs to one query: give this "
                f"query ({query}) a transactionalIdPrefix of its own. Micro-batch {batch} "
                "is not written")
        driver.recover(keep=frozenset(winners))
        if max((d.batch for d in decisions), default=NO_BATCH) >= batch:
            if run is not None:
                driver.abort_open(run)
            log.info("%s: micro-batch %d was committed before; this run of it is aborted",
                     prefix, batch)
            return False
        if winners:
            assert run is not None
            driver.check_prepared(run, winners)
            driver.decide(Decision(run, batch, frozenset(winners), query), min(topics))
            driver.finish(frozenset(winners), winners)
        if run is not None:
            driver.abort_open(run, keep=frozenset(winners))
        return True


def recover(options: WriteOptions, prefix: str | None = None) -> tuple[list[str], list[str]]:
    """Before a batch write's tasks, and for an operator (``oncelog spark recover``): opens
    P (failing when the broker refuses two-phase commit) and ends what earlier runs left
    open: (finished, aborted)."""
    with Driver(options, prefix) as driver:
        return driver.recover()


def check(options: WriteOptions) -> None:
    """Fails when the broker refuses two-phase commit: opens P, or an id of no job's when
    the prefix is known only to the tasks (a query's id)."""
    Driver(options, options.transactional_id_prefix or _CHECK_ID).close()
