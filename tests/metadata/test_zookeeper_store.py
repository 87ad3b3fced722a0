"""The MetadataStore interface on a real ZooKeeper (metadata/zookeeper.py), and producer-id
blocks claimed through it by concurrent brokers: never one id twice."""

from __future__ import annotations

import socket
import threading

import pytest

from oncelog.coordinator.producer_id_manager import BLOCK_PATH, ProducerIdManager, carry_over
from oncelog.metadata.store import NO_VERSION, BadVersion, LocalFileStore
from oncelog.metadata.zookeeper import ZooKeeperStore, ZooKeeperUnreachable, parse_connect

SESSION_MS = 4000


@pytest.fixture
def zk_store(zookeeper):
    stores: list[ZooKeeperStore] = []

    def make(connect: str | None = None) -> ZooKeeperStore:
        store = ZooKeeperStore(connect or zookeeper.chroot(), SESSION_MS)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture(params=["local", "zookeeper"])
def any_store(request, tmp_path, zk_store):
    if request.param == "local":
        return LocalFileStore(str(tmp_path / "meta"))
    return zk_store()


def test_store_contract(any_store):
    """Both stores answer the interface alike: versions from 0, compare-and-set, delete."""
    store = any_store
    assert store.get("a/b") == (None, NO_VERSION)
    assert store.compare_and_set("a/b", {"x": 1}, NO_VERSION) == 0
    with pytest.raises(BadVersion):
        store.compare_and_set("a/b", {"x": 2}, NO_VERSION)
    assert store.compare_and_set("a/b", {"x": 2}, 0) == 1
    with pytest.raises(BadVersion):
        store.compare_and_set("a/b", {"x": 3}, 0)
    assert store.get("a/b") == ({"x": 2}, 1)
    store.compare_and_set("a/c", "text", NO_VERSION)
    assert store.children("a") == ["b", "c"]
    with pytest.raises(BadVersion):
        store.delete("a/b", 0)
    store.delete("a/b", 1)
    store.delete("a/b")  # already gone: nothing to do
    assert store.get("a/b") == (None, NO_VERSION)
    assert store.children("a") == ["c"]
    assert store.children("nothing/here") == []


def test_chroot_isolates_and_is_created(zookeeper, zk_store):
    connect = zookeeper.chroot("deep") + "/two/levels"
    one = zk_store(connect)
    other = zk_store(zookeeper.chroot())
    one.compare_and_set(BLOCK_PATH, {"v": 1}, NO_VERSION)
    assert other.get(BLOCK_PATH) == (None, NO_VERSION)
    assert zk_store(connect).get(BLOCK_PATH) == ({"v": 1}, 0)
    root = zk_store(zookeeper.connect)
    chroot = parse_connect(connect)[1]
    assert root.get(chroot.strip("/") + "/" + BLOCK_PATH) == ({"v": 1}, 0)


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:2181", ("127.0.0.1:2181", "")),
    ("a:1,b:2/kafka", ("a:1,b:2", "/kafka")),
    ("a:1/x/y/", ("a:1", "/x/y")),
])
def test_parse_connect(text, expected):
    assert parse_connect(text) == expected


@pytest.mark.parametrize("text", ["", "host", "a:1,", "a:1//x", "a:99999", "a:1 b:2"])
def test_parse_connect_refuses(text):
    with pytest.raises(ValueError):
        parse_connect(text)


def test_unreachable_zookeeper_is_an_error_not_a_hang():
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(ZooKeeperUnreachable, match=f"127.0.0.1:{port}"):
            ZooKeeperStore(f"127.0.0.1:{port}", SESSION_MS, connection_timeout_ms=300)


CLAIMERS = 3
IDS_EACH = 150
BLOCK = 7  # small blocks: many claims, so claimers race for the same node version often


def test_concurrent_brokers_never_hand_out_the_same_producer_id(zookeeper, zk_store):
    """Three brokers (each its own ZooKeeper session) claim blocks at once from one
    /latest_producer_id_block: every id is handed out once, and the blocks tile 0..N."""
    connect = zookeeper.chroot()
    managers = [ProducerIdManager(zk_store(connect), broker_id=b, block_size=BLOCK)
                for b in range(CLAIMERS)]
    issued: list[list[int]] = [[] for _ in managers]
    errors: list[BaseException] = []
    start = threading.Barrier(CLAIMERS, timeout=30)

    def claim(i: int) -> None:
        try:
            start.wait()
            for _ in range(IDS_EACH):
                issued[i].append(managers[i].generate())
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    everything = [pid for ids in issued for pid in ids]
    assert len(set(everything)) == len(everything) == CLAIMERS * IDS_EACH
    value, version = managers[0].store.get(BLOCK_PATH)
    claims = CLAIMERS * -(-IDS_EACH // BLOCK)
    # One successful write per block: the node's version counts them, and the last block
    # ends where all the blocks laid end to end do.
    assert version == claims - 1
    assert value["version"] == 1 and int(value["block_end"]) == claims * BLOCK - 1
    assert int(value["block_start"]) == int(value["block_end"]) - BLOCK + 1
    assert value["broker"] in range(CLAIMERS)


def test_joining_a_cluster_never_reissues_a_local_producer_id(tmp_path, zk_store):
    """A broker that handed out ids from its local store joins a cluster: the cluster's
    blocks continue above them, and a cluster already further on is left alone."""
    local = LocalFileStore(str(tmp_path / "meta"))
    alone = ProducerIdManager(local, broker_id=5, block_size=BLOCK)
    issued = {alone.generate() for _ in range(BLOCK + 2)}  # into its second block
    cluster = zk_store()
    carry_over(local, cluster, broker_id=5)
    joined = ProducerIdManager(cluster, broker_id=5, block_size=BLOCK)
    first = joined.generate()
    assert first == 2 * BLOCK and first not in issued
    value, version = cluster.get(BLOCK_PATH)
    carry_over(local, cluster, broker_id=5)  # again (a restart): nothing to do
    assert cluster.get(BLOCK_PATH) == (value, version)


@pytest.mark.parametrize("requested_ms, negotiated_ms", [(200, 500), (100_000, 60_000)])
def test_the_session_timeout_is_the_one_zookeeper_negotiated(zookeeper, requested_ms,
                                                             negotiated_ms, caplog):
    """The test server allows sessions of 500 ms to 60 s (two ticks to its
    maxSessionTimeout): a broker asking outside that gets the server's bound, and everything
    timed by the session (the half-timeout fence, the heartbeats) must follow what ZooKeeper
    will enforce, not what was asked, or a leader fences itself after its session is gone."""
    store = ZooKeeperStore(zookeeper.chroot(), requested_ms, connection_timeout_ms=SESSION_MS)
    try:
        assert store.requested_session_timeout_ms == requested_ms
        assert store.session_timeout_ms == negotiated_ms
        assert f"negotiated a session timeout of {negotiated_ms} ms" in caplog.text
    finally:
        store.close()
