"""Exactly-once writes from Spark: every task writes in its own transaction and prepares it
(two-phase commit, KIP-939); the driver decides, durably, and then commits the prepared
transactions. Every decision about the sink's transactions lives in this file.

Names. ``P`` is the prefix (option ``transactionalIdPrefix``; by default one per topic for
a batch write, one per checkpoint location for a stream), ``R`` a random run id chosen on the
driver when Spark asks for a writer (once for a batch write, once per micro-batch for a
stream):

| transactional id        | who uses it                      | what it holds                   |
|-------------------------|----------------------------------|---------------------------------|
| ``P``                   | the driver                       | the decisions (below); opening  |
|                         |                                  | it fences an older driver of P  |
| ``P-R-p-t``             | the task attempt t (Spark's task | that attempt's rows, prepared,  |
|                         | attempt id, unique in the app)   | never committed by the task     |
|                         | writing partition p              |                                 |

A decision is an offset of the consumer group ``P``, committed in a transaction of ``P``
(send_offsets_to_transaction), so it is written whole or not at all: its metadata names the
run, the micro-batch (-1 for a batch write) and the winners, the transactional ids whose
commit messages reached the driver's ``commit()``. Its offset is the micro-batch + 1.

Who aborts and who commits what, when:

| when                                  | who            | does                                 |
|---------------------------------------|----------------|--------------------------------------|
| a task's write raises                 | the task       | aborts its own transaction           |
| a task prepared, and a decision of    | the task       | aborts its own transaction (an       |
| its run and batch without it exists   |                | attempt the driver could not see)    |
| Spark asks for a batch writer (before | the driver     | opens ``P`` (fails naming            |
| any task runs)                        | (``recover``)  | transaction.two.phase.commit.enable  |
|                                       |                | if the broker refuses 2PC); every    |
|                                       |                | open transaction ``P-*`` named a     |
|                                       |                | winner by a decision is committed,   |
|                                       |                | every other one aborted (a dead      |
|                                       |                | driver's run, a killed task)         |
| Spark asks for a stream writer        | the driver     | opens ``P`` only (Spark asks again   |
|                                       |                | in the process that commits, while   |
|                                       |                | the batch's transactions are open)   |
| ``commit()`` of a batch write         | the driver     | writes the decision, then commits    |
|                                       |                | each winner (EndTxn with its         |
|                                       |                | prepared id and epoch; if that epoch |
|                                       |                | moved on, as ``recover``: whatever   |
|                                       |                | is open under the winner's id),      |
|                                       |                | then aborts every other open         |
|                                       |                | ``P-R-*`` (retried, speculative and  |
|                                       |                | killed attempts)                     |
| ``commit()`` of a stream's batch N    | the driver     | first ``recover`` but for N's        |
|                                       |                | winners (one batch of a query runs   |
|                                       |                | at a time: the rest are leftovers);  |
|                                       |                | when a decision covers N already     |
|                                       |                | (the sink committed N, Spark died    |
|                                       |                | before its checkpoint), aborts N's   |
|                                       |                | transactions; else as a batch write  |
| ``abort()``                           | the driver     | batch write: aborts every open       |
|                                       |                | ``P-R-*``; stream: ``recover``       |

The driver ends others' transactions without a producer for each: EndTxn with the id and
epoch a winner prepared, or InitProducerId as a new instance of the id (which aborts what is
open, or with keep_prepared_txn keeps it for an EndTxn at the new epoch), pipelined on one
connection per coordinator (``Admin.end_transactions``, ``Admin.fence_transactions``).

Why it is exactly once. Before the decision nothing of the run is visible, and the next
``recover`` (or ``abort()``) aborts all of it: a job that dies before ``commit()`` is run
again from nothing. After the decision the run is committed even if the driver dies halfway
through the winners: ``recover`` finishes them (roll forward), and aborts only what no decision
names. A stream's batch N whose decision exists is not written again when Spark re-runs it,
as its checkpoint had not recorded N; ``commit()`` of N+1 comes only after N, so the stored
batch id only grows. Prepared transactions have no timeout (two-phase commit), so nothing
but these rules ends them: every open ``P-*`` transaction is ended by the next commit, abort
or recover of P. One prefix must not be used by two jobs or queries at the same time (as
Flink's transactional id prefix): the second's ``recover`` would end the first's work (it
fences the first driver, whose commit then fails whole).

What a batch job cannot know: a driver that dies after its decision was written leaves a
committed run (finished by the next ``recover``); running that job again writes it again.
What stays open until the next commit, abort or recover of P: a task attempt that Spark
kills while it is still writing, after the driver's last listing (a speculative copy that
outlives its job); read_committed readers of its partitions wait at its first record until
then.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import zlib
from base64 import b64decode, b64encode
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ..client.admin import Admin
from ..client.connection import KafkaError
from ..client.producer import Producer
from ..client.topic_partition import OffsetAndMetadata
from ..client.transactions import PreparedTxnState
from .options import OptionError, WriteOptions

log = logging.getLogger(__name__)

TIMEOUT = 120.0  # seconds for each coordinator step (init, prepare, commit, abort)
NO_BATCH = -1  # a decision of a batch write
_METADATA_LIMIT = 4000  # offset.metadata.max.bytes is 4096 by default
TWO_PHASE_KEY = "transaction.two.phase.commit.enable"


def new_run() -> str:
    return secrets.token_hex(4)


def task_transactional_id(prefix: str, run: str, partition: int, attempt_id: int) -> str:
    return f"{prefix}-{run}-{partition}-{attempt_id}"


def _pattern(*parts: str) -> str:
    """ListTransactions' filter: the whole id must match (Java's Matcher.matches)."""
    return re.escape("-".join(parts) + "-") + ".*"


@dataclass(frozen=True)
class Decision:
    run: str
    batch: int  # the micro-batch; NO_BATCH for a batch write
    winners: frozenset[str]  # transactional ids to commit

    def metadata(self) -> str:
        text = json.dumps({"run": self.run, "batch": self.batch,
                           "winners": sorted(self.winners)}, separators=(",", ":"))
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
            return cls(str(data["run"]), int(data["batch"]), frozenset(data["winners"]))
        except (ValueError, KeyError, TypeError, zlib.error):
            return None  # not a decision of this sink


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


def decided_without(options: WriteOptions, run: str, batch: int,
                    transactional_id: str) -> bool:
    """Whether the driver decided ``run``'s ``batch`` already, without this task attempt (a
    retried or speculative copy of it won): read after the attempt prepared, so that an
    attempt the driver's last listing could not see ends its transaction itself."""
    with Admin({"bootstrap.servers": options.bootstrap}) as admin:
        for decision in _decisions(admin, options.transactional_id_prefix):
            if decision.run == run and decision.batch == batch and \
                    transactional_id not in decision.winners:
                return True
    return False


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
    transactions. ``with Driver(options) as d:``."""

    def __init__(self, options: WriteOptions, decides: bool = False) -> None:
        """Opens ``P``, fencing any older driver of it: with a producer of ``P`` when this
        one ``decides``, else through the admin connection alone."""
        self.options = options
        self.prefix = options.transactional_id_prefix
        self.admin = Admin({"bootstrap.servers": options.bootstrap})
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

    def last_batch(self) -> int:
        """The highest micro-batch a decision covers (NO_BATCH: none)."""
        return max((d.batch for d in self.decisions()), default=NO_BATCH)

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

    # --- ending others' transactions ----------------------------------------------------

    def open_transactions(self, *parts: str) -> list[str]:
        """The transactional ids ``P-<parts>-*`` with a transaction open."""
        pattern = _pattern(self.prefix, *parts)
        listed = self.admin.list_transactions(states=("Ongoing",), pattern=pattern)
        return sorted({t.transactional_id for ts in listed.values() for t in ts})

    def commit(self, winners: dict[str, str]) -> None:
        """Commit each winner's prepared transaction (transactional id -> "id:epoch") with
        EndTxn at the epoch it was prepared with. One whose epoch moved on (a ``recover``
        took it over) or that is no longer open is committed as ``recover`` does: whatever
        is open under a winner's id is its prepared transaction, which a decision names."""
        prepared = {t: PreparedTxnState.parse(p) for t, p in winners.items()}
        answers = self.admin.end_transactions(
            {t: (p.producer_id, p.epoch) for t, p in prepared.items()}, commit=True)
        self.commit_kept([t for t, error in answers.items() if error != ErrorCode.none])

    def abort(self, transactional_ids: list[str]) -> None:
        """Abort the open transaction of each id (fencing its instances)."""
        for fenced in self.admin.fence_transactions(transactional_ids).values():
            if isinstance(fenced, KafkaError):
                raise fenced

    def commit_kept(self, transactional_ids: list[str]) -> None:
        """Commit whatever transaction is open under each id (a decision names it)."""
        kept = {}
        for transactional_id, fenced in self.admin.fence_transactions(
                transactional_ids, keep_prepared=True).items():
            if isinstance(fenced, KafkaError):
                raise fenced
            if fenced.ongoing_producer_id >= 0:  # else nothing open: committed meanwhile
                kept[transactional_id] = (fenced.producer_id, fenced.epoch)
        for transactional_id, error in self.admin.end_transactions(kept, True).items():
            if error != ErrorCode.none:
                raise KafkaError(error, f"{transactional_id}: committing the prepared "
                                        "transaction a decision named")
            log.info("%s: committed the prepared transaction a decision named",
                     transactional_id)

    def abort_open(self, *parts: str, keep: frozenset[str] = frozenset()) -> list[str]:
        """Abort every open transaction ``P-<parts>-*`` but those in ``keep``."""
        doomed = [t for t in self.open_transactions(*parts) if t not in keep]
        self.abort(doomed)
        if doomed:
            log.info("%s: aborted %d open transactions: %s", self.prefix, len(doomed),
                     ", ".join(doomed))
        return doomed

    def recover(self, keep: frozenset[str] = frozenset()) -> None:
        """Finish what a decision committed, abort every other open transaction of P but
        those in ``keep``. The decisions are read only when something is open: the common
        case (the last run ended everything) costs one listing."""
        open_ids = self.open_transactions()
        if not open_ids:
            return
        winners = frozenset().union(*(d.winners for d in self.decisions()))
        self.abort([t for t in open_ids if t not in winners and t not in keep])
        self.commit_kept([t for t in open_ids if t in winners])


def commit_run(options: WriteOptions, run: str, winners: dict[str, str],
               topics: set[str]) -> None:
    """The driver's commit() of a batch write's tasks."""
    with Driver(options, decides=True) as driver:
        if winners:
            driver.decide(Decision(run, NO_BATCH, frozenset(winners)), min(topics))
            driver.commit(winners)
        driver.abort_open(run, keep=frozenset(winners))


def abort_run(options: WriteOptions, run: str) -> None:
    with Driver(options) as driver:
        driver.abort_open(run)


def commit_micro_batch(options: WriteOptions, run: str | None, batch: int,
                       winners: dict[str, str], topics: set[str]) -> bool:
    """The driver's commit() of a stream's micro-batch ``batch`` (Spark calls it with a
    writer made anew, so ``run`` comes from the tasks' messages). One batch of a query runs
    at a time: every open transaction of P that is not this batch's winner is a leftover.
    False when a decision already covered ``batch``: this run of it is aborted."""
    with Driver(options, decides=True) as driver:
        driver.recover(keep=frozenset(winners))
        if driver.last_batch() >= batch:
            driver.abort_open()
            log.info("%s: micro-batch %d was committed before; this run of it is aborted",
                     options.transactional_id_prefix, batch)
            return False
        if winners:
            assert run is not None
            driver.decide(Decision(run, batch, frozenset(winners)), min(topics))
            driver.commit(winners)
        driver.abort_open(keep=frozenset(winners))
        return True


def recover(options: WriteOptions) -> None:
    """Before a batch write's tasks, and when a micro-batch is aborted: opens P (failing
    when the broker refuses two-phase commit) and ends what earlier runs left open."""
    with Driver(options) as driver:
        driver.recover()


def check(options: WriteOptions) -> None:
    """Opens P only: fails when the broker refuses two-phase commit."""
    Driver(options).close()
