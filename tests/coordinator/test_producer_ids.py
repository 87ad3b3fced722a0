"""Producer id blocks: claimed by compare-and-set, never issued twice, never wrapped."""

import multiprocessing

import pytest

from oncelog.coordinator.producer_id_manager import (
    BLOCK_PATH,
    MAX_PRODUCER_ID,
    ProducerIdManager,
    ProducerIdsExhausted,
)
from oncelog.metadata.store import NO_VERSION, BadVersion, LocalFileStore


def test_two_brokers_on_one_store_never_issue_the_same_id(tmp_path):
    store = LocalFileStore(str(tmp_path))
    a, b = ProducerIdManager(store, 1, block_size=10), ProducerIdManager(store, 2, block_size=10)
    issued = [m.generate() for _ in range(35) for m in (a, b)]
    assert len(set(issued)) == len(issued)
    value, version = store.get(BLOCK_PATH)
    assert value["version"] == 1 and int(value["block_end"]) - int(value["block_start"]) == 9
    assert version == 7  # eight blocks claimed, one compare-and-set each (versions from 0)


def test_a_restarted_broker_never_reissues(tmp_path):
    first = ProducerIdManager(LocalFileStore(str(tmp_path)), 1)
    used = {first.generate() for _ in range(5)}
    again = ProducerIdManager(LocalFileStore(str(tmp_path)), 1)
    assert again.generate() not in used
    assert again.generate() >= 1000  # the rest of the first block is given up, not reused


def _claim(directory: str, queue) -> None:
    manager = ProducerIdManager(LocalFileStore(directory), 0, block_size=5)
    queue.put([manager.generate() for _ in range(50)])


def test_processes_racing_for_blocks_get_disjoint_ids(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(str(tmp_path), queue)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    ids = [i for r in results for i in r]
    assert len(set(ids)) == len(ids) == 200


def test_exhaustion_is_an_error_not_a_wrap(tmp_path):
    store = LocalFileStore(str(tmp_path))
    store.compare_and_set(BLOCK_PATH, {"version": 1, "broker": 0,
                                       "block_start": str(MAX_PRODUCER_ID - 1999),
                                       "block_end": str(MAX_PRODUCER_ID - 1000)}, NO_VERSION)
    manager = ProducerIdManager(store, 0)
    assert manager.generate() == MAX_PRODUCER_ID - 999
    for _ in range(999):
        manager.generate()
    with pytest.raises(ProducerIdsExhausted):
        manager.generate()


def test_issued_means_claimed_by_any_broker(tmp_path):
    store = LocalFileStore(str(tmp_path))
    a, b = ProducerIdManager(store, 1), ProducerIdManager(store, 2)
    pid = b.generate()
    assert a.is_issued(pid)  # a reads the store again for an id above what it knew
    assert not a.is_issued(5000) and not a.is_issued(-1)
    assert a.highest_claimed() == 999


def test_compare_and_set_refuses_a_stale_version(tmp_path):
    store = LocalFileStore(str(tmp_path))
    version = store.compare_and_set("k", {"v": 1}, NO_VERSION)
    store.compare_and_set("k", {"v": 2}, version)
    with pytest.raises(BadVersion):
        store.compare_and_set("k", {"v": 3}, version)
    assert store.get("k") == ({"v": 2}, version + 1)


class _AlwaysLoses:
    """A store where another broker wins every race: each compare-and-set finds a newer version."""

    def __init__(self) -> None:
        self.attempts = 0

    def get(self, path):
        return {"version": 1, "broker": 9, "block_start": "0", "block_end": str(self.attempts)}, \
            self.attempts

    def compare_and_set(self, path, value, version):
        self.attempts += 1
        raise BadVersion(path)


def test_a_broker_losing_every_race_backs_off_and_gives_up_by_time_not_count(monkeypatch):
    """Losing races is bounded by a deadline (a retriable error, as ZooKeeper being away is),
    never by a count of attempts that a busy cluster can exhaust while it progresses."""
    from oncelog.metadata import store as races
    from oncelog.metadata.store import MetadataUnavailable, StillContended

    now = [0.0]
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds + 0.01  # each attempt also costs a round trip

    monkeypatch.setattr(races, "_clock", lambda: now[0])
    monkeypatch.setattr(races, "_sleep", sleep)
    store = _AlwaysLoses()
    manager = ProducerIdManager(store, broker_id=1)
    with pytest.raises(StillContended) as caught:
        manager.generate()
    assert isinstance(caught.value, MetadataUnavailable)
    assert store.attempts > 100  # far more than any fixed count a busy cluster could exhaust
    assert now[0] >= races.RACE_DEADLINE_S
    assert all(0 <= p <= races._BACKOFF_MAX_S for p in pauses)
    assert max(pauses) > races._BACKOFF_FIRST_S  # the pause grows
