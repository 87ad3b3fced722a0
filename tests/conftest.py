import itertools
import os
import sys
from pathlib import Path

import pytest
from support.brokers import BrokerProcess

# The suite starts hundreds of Python processes (brokers, the command-line tools, Spark's
# Python workers, helper scripts), each importing oncelog: with PYTHONDONTWRITEBYTECODE set
# (as in the sessions that run it) every one compiled oncelog from source again, 0.35 s of
# CPU of the 1.05 s a broker takes to import it. Bytecode is written (to the ignored
# __pycache__ folders) and read again instead.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

_names = itertools.count()

# kio imports hypothesis whenever it can (to register strategies for its types), and every
# process that imports a client or the broker imports kio: 0.2 s of CPU for each broker started
# from a fresh interpreter, command-line tool, Spark Python worker and planner, helper script.
# A package named hypothesis that fails to import, first on their PYTHONPATH, makes kio go
# without it (kio/static/_phantom.py: ``except ImportError: hypothesis = None``); none of them
# uses hypothesis. Not for the test processes themselves: this one imported hypothesis already,
# and under xdist the controller's environment is the workers', which run property tests.
WITHOUT_HYPOTHESIS = str(Path(__file__).parent / "support" / "without_hypothesis")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        return  # the xdist controller: it starts the test workers
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [WITHOUT_HYPOTHESIS, *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.fixture
def start_broker(tmp_path):
    """Factory: start_broker(**settings) -> a running BrokerProcess, stopped at teardown."""
    started: list[BrokerProcess] = []

    def start(**settings: str) -> BrokerProcess:
        config = {key.replace("_", "."): str(value) for key, value in settings.items()}
        broker = BrokerProcess(tmp_path / f"broker{next(_names)}", config).start()
        started.append(broker)
        return broker

    yield start
    for broker in started:
        if broker.alive:
            code = broker.stop()
            assert code == 0, f"broker exited with {code}; its log:\n{broker.log_text()}"
        assert "Traceback" not in broker.log_text(), broker.log_text()


@pytest.fixture
def broker(start_broker):
    return start_broker()


@pytest.fixture(scope="session")
def _spark_sessions():
    from support import sparks

    yield sparks
    sparks.stop()


@pytest.fixture
def spark(_spark_sessions):
    """The shared local[2] Spark session (see tests/support/sparks.py)."""
    return _spark_sessions.spark_session("local[2]")


@pytest.fixture(scope="session")
def secured(tmp_path_factory):
    """One broker for the session's security tests, with SASL_SSL, SSL (mutual TLS),
    SASL_PLAINTEXT and PLAINTEXT listeners (tests/support/secured.py)."""
    from support.secured import start_secured

    found = start_secured(tmp_path_factory.mktemp("secured"))
    yield found
    code = found.broker.stop()
    assert code == 0, found.broker.log_text()
    assert "Traceback" not in found.broker.log_text(), found.broker.log_text()


@pytest.fixture(scope="session")
def zookeeper():
    """One real ZooKeeper server for the session's cluster tests (tests/support/zookeepers.py); each
    test takes its own chroot with ``zookeeper.chroot()``."""
    from support.zookeepers import ZooKeeperServer

    server = ZooKeeperServer().start()
    yield server
    server.close()


# The files with a test of 15 s or more, or 30 s of tests, on a busy machine (``make test``
# prints the slowest): started right after the Spark tests. A name missing here costs
# balance, not a test. Measured again for issue 22 (the candidates in one process, load 4-5):
# test_compaction_kill came in (24 s); out went test_group_migration, _compaction_transactions,
# _frame_reader, _produce_request, _txn_history (longest 6-11 s) and test_server_assignors
# (its strategies made once: 2-4 s a test).
LONG = {
    "test_client_model.py", "test_txn_workload.py", "test_frame_check.py",
    "test_compaction_kill.py", "test_producer_state.py", "test_linear_time.py",
    "test_txn_copier.py", "test_storage_faults.py", "test_failover_scenario.py",
    "test_compaction_crash.py", "test_copy_job.py", "test_fuzz_frames.py",
    "test_resource_bounds.py", "test_txn_storage.py", "test_idempotent_clients.py",
    "test_descriptors.py",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The Spark tests first, then those of the LONG files, then the rest (stable within
    each): ``-n 4 --dist loadgroup`` hands tests out one at a time in this order as workers
    free up (see the Makefile and SparkOnFewScheduling below). Collected late (protocol/,
    producer_state/), a long one left one worker running for a minute after the others had
    finished."""
    items.sort(key=lambda item: (not item.path.name.startswith("test_spark"),
                                 item.path.name not in LONG, _own_spark_master(item)))


def _own_spark_master(item: pytest.Item) -> bool:
    """A test that asks the shared session for a master of its own (local[2,3]: task retries)
    through ``_spark_sessions`` rather than ``spark``: run after the other Spark tests, each
    switch of the shared session's master is a JVM start (10-20 s of CPU), and after them
    nothing switches it back."""
    names = getattr(item, "fixturenames", ())
    return "_spark_sessions" in names and "spark" not in names


# --- xdist: more workers than cores, the Spark tests on two of them -------------------------
#
# Most of the suite waits (brokers starting, timeouts a test lets run out, kills and
# elections): measured with support.cpu_profile on 2 cores, the tests' CPU was 42% of their
# wall time, so two workers left the cores idle more than half the run (10:08). Four workers
# fill that time (7:01) but each started its own Spark JVM and ran a quarter of the Spark
# tests in it, with less JIT warmth to share: the Spark tests' CPU went from 349 s to 659 s.
# So Spark's tests go to the first SPARK_WORKERS workers only (their shared sessions, as with
# two workers), and the others take the rest of the suite meanwhile.
SPARK_WORKERS = 2


def _is_spark(nodeid: str) -> bool:
    return nodeid.startswith("tests/spark/")


def _worker_number(node) -> int:
    """xdist's gw<N>; a worker named otherwise (--tx ...//id=) is not a Spark worker."""
    try:
        return int(node.gateway.id.removeprefix("gw"))
    except ValueError:
        return SPARK_WORKERS


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: -p no:xdist runs without it
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadgroup":
        return None  # xdist's own for any other --dist
    from xdist.scheduler import LoadScopeScheduling

    class SparkOnFewScheduling(LoadScopeScheduling):
        """One test a unit, handed out in collection order (pytest_collection_modifyitems)
        as a worker runs low, as ``--dist loadgroup`` with no groups does, except that a
        Spark test goes only to a Spark worker while one is alive (a worker that crashed and
        was replaced gets a new number: then any worker takes them).

        A worker reports its last test only once it is sent another or shut down, so a
        worker is never left holding fewer than two tests while any it may run is queued,
        and is shut down as soon as none is. After a crash xdist queues every unit the dead
        worker had, finished ones too: those are dropped here, never sent (an empty unit
        sent to a worker holding one test left it waiting for ever)."""

        def _split_scope(self, nodeid: str) -> str:
            return nodeid

        def _may_run(self, node, nodeid: str) -> bool:
            if not _is_spark(nodeid) or _worker_number(node) < SPARK_WORKERS:
                return True
            return not any(_worker_number(n) < SPARK_WORKERS and not n.shutting_down
                           for n in self.nodes)

        def _assign_work_unit(self, node) -> bool:
            for scope in list(self.workqueue):
                work_unit = self.workqueue[scope]
                if all(work_unit.values()):
                    del self.workqueue[scope]  # finished: re-queued by a crash
                    continue
                if not self._may_run(node, scope):
                    continue
                del self.workqueue[scope]
                self.assigned_work.setdefault(node, {})[scope] = work_unit
                collection = self.registered_collections[node]
                node.send_runtest_some([collection.index(nodeid)
                                        for nodeid, done in work_unit.items() if not done])
                return True
            return False

        def _reschedule(self, node) -> None:
            if node.shutting_down or node not in self.registered_collections:
                return  # a replacement still collecting: scheduled once it has
            while self._pending_of(self.assigned_work.get(node, {})) < 2:
                if not self._assign_work_unit(node):
                    break
            if not any(self._may_run(node, scope) and not all(unit.values())
                       for scope, unit in self.workqueue.items()):
                node.shutdown()  # nothing left it may run: it finishes what it holds

    return SparkOnFewScheduling(config, log)
