"""The metadata store on a full disk (issue 28 #5 of the storage faults): a write is all or
nothing. A real small tmpfs (the tests run as root, see test_full_disk.py): compare_and_set
and delete on it when it is full either change nothing (OSError, the old value and version
still read back, no temporary file left to hold space) or all; once space is freed the same
writes go through with the next version."""

from __future__ import annotations

import errno
import os

import pytest
from support.full_disk_helpers import fill_up, small_tmpfs

from oncelog.metadata.store import LocalFileStore

BIG = {"configs": {f"key.{i}": "v" * 100 for i in range(200)}}  # about 25 KB of JSON


def test_a_write_to_a_full_disk_changes_nothing_and_leaves_nothing(tmp_path):
    with small_tmpfs(tmp_path / "disk", "256k") as disk:
        store = LocalFileStore(str(disk / "meta"))
        version = store.compare_and_set("topics/a", {"partitions": 1}, -1)
        filler = disk / "filler"
        fill_up(filler)
        with pytest.raises(OSError) as caught:
            store.compare_and_set("topics/a", BIG, version)
        assert caught.value.errno == errno.ENOSPC
        with pytest.raises(OSError):
            store.compare_and_set("topics/b", BIG, -1)
        assert store.get("topics/a") == ({"partitions": 1}, version)
        assert store.get("topics/b") == (None, -1)
        assert store.children("topics") == ["a"]
        assert [n for n in os.listdir(disk / "meta") if n.endswith(".tmp")] == []
        store.delete("topics/a")  # a delete frees space, full disk or not
        assert store.get("topics/a") == (None, -1)
        os.unlink(filler)
        assert store.compare_and_set("topics/b", BIG, -1) == 0
        assert store.get("topics/b") == (BIG, 0)
        assert LocalFileStore(str(disk / "meta")).children("topics") == ["b"]  # reopened


def test_the_start_corrects_hostile_internal_overrides_on_a_full_disk(tmp_path):
    """The start's correction of an internal topic's stored overrides (cleanup.policy
    delete, segment.bytes 14: stored by an older version) writes nothing, so a full disk
    cannot leave it half done: the broker starts, __consumer_offsets is compacted with its
    segment size, the committed offset is there, and the stored overrides are as they were
    (corrected again at each start)."""
    import json

    from confluent_kafka.admin import AdminClient, ResourceType
    from support.brokers import BrokerProcess, create_topic
    from support.config_hygiene_helpers import _commit, _committed, _describe

    with small_tmpfs(tmp_path / "disk", "8m") as disk:
        broker = BrokerProcess(disk / "data", {"offsets.topic.num.partitions": "1"}).start()
        try:
            create_topic(broker.bootstrap, "t")
            _commit(broker.bootstrap, "g", "t", 9)
            broker.stop()
            stored = broker.data_dir / ".oncelog-metadata" / "topics%2F__consumer_offsets.json"
            entry = json.loads(stored.read_text())
            entry["value"]["configs"] = {"cleanup.policy": "delete", "retention.ms": "0",
                                         "segment.bytes": "14"}
            stored.write_text(json.dumps(entry))
            fill_up(disk / "filler")
            broker.start()
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            described = _describe(admin, ResourceType.TOPIC, "__consumer_offsets")
            assert described["cleanup.policy"] == "compact"
            assert described["segment.bytes"] == str(100 << 20)
            assert _committed(broker.bootstrap, "g", "t") == 9
            assert json.loads(stored.read_text()) == entry  # nothing written
        finally:
            broker.stop()
        assert "Traceback" not in broker.log_text()
