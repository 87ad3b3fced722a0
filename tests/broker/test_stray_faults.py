"""Setting a directory aside fails (issue 23's strays: a topic deleted or re-created while a
broker was down, a lost metadata store): the rename to "...-stray" or "...-delete", or the
log directory's fsync after it, fails with EIO. The directory then goes offline, as Kafka
takes a log directory offline on any failed operation: what could not be moved is never
read again, never as a new topic of the same name, and never stops the broker; the next
start, on a healthy disk, sets it aside. JBOD: the other directory goes on serving. Running
out of descriptors is no failure of a directory: a deletion then does nothing and is
retriable, a start fails. A deletion no rename decided is decided by the metadata entry's
removal, or refused and the topic kept."""

from __future__ import annotations

import errno
import os
import uuid

from support.compaction_config_helpers import NoProducers

from oncelog.broker.config import BrokerConfig
from oncelog.broker.topics import STRAY_SUFFIX, TopicError, TopicManager
from oncelog.log import partition_metadata
from oncelog.log.disk import OsDisk
from oncelog.metadata.store import LocalFileStore


class FailingDisk(OsDisk):
    """The real filesystem, whose renames into ``under`` (and fsyncs of it, with
    ``fsyncs``) fail with ``error`` (EIO) while ``armed``; with ``no_descriptor``, opening
    ``under`` (its fsync's descriptor) fails with EMFILE."""

    def __init__(self, under: str, fsyncs: bool = False, error: int = errno.EIO) -> None:
        self.under = under
        self.fsyncs = fsyncs
        self.error = error
        self.armed = True
        self.no_descriptor = False
        self.refused: list[str] = []

    def _refuse(self, path: str, error: int) -> None:
        self.refused.append(path)
        raise OSError(error, os.strerror(error), path)

    def rename(self, src: str, dst: str) -> None:  # type: ignore[override]
        if self.armed and not self.fsyncs and dst.startswith(self.under + os.sep):
            self._refuse(dst, self.error)
        os.replace(src, dst)

    def fsync_dir(self, path: str) -> None:  # type: ignore[override]
        if self.armed and self.fsyncs and path == self.under:
            self._refuse(path, self.error)
        OsDisk.fsync_dir(path)

    def open_dir(self, path: str) -> int:  # type: ignore[override]
        if self.no_descriptor and path == self.under:
            self._refuse(path, errno.EMFILE)
        return OsDisk.open_dir(path)


class FailingStore(LocalFileStore):
    """The metadata store, whose deletions fail with EIO while ``armed``."""

    armed = False

    def delete(self, path: str, expected_version: int | None = None) -> None:
        if self.armed:
            raise OSError(errno.EIO, "injected", path)
        super().delete(path, expected_version)


def manager(tmp_path, disk: OsDisk | None = None, store: LocalFileStore | None = None,
            dirs: str = "ab") -> TopicManager:
    config = BrokerConfig({"log.dirs": ",".join(str(tmp_path / d) for d in dirs)})
    return TopicManager(config, store or LocalFileStore(str(tmp_path / "meta")),
                        NoProducers(), disk=disk)


def dirs(tmp_path) -> tuple[str, str]:
    return str(tmp_path / "a"), str(tmp_path / "b")


def entries(path: str) -> list[str]:
    return sorted(os.listdir(path))


def stray(directory: str) -> None:
    """A partition directory "ghost-0" of a topic no metadata knows."""
    os.makedirs(os.path.join(directory, "ghost-0"))
    partition_metadata.write(OsDisk(), os.path.join(directory, "ghost-0"), uuid.uuid4())


def test_a_stray_that_cannot_be_set_aside_at_start_takes_only_its_directory_offline(tmp_path):
    a, b = dirs(tmp_path)
    first = manager(tmp_path)
    first.create("live", 2, 1, {})  # one partition in each directory
    first.close()
    ghost = os.path.join(a, "ghost-0")  # of no topic the metadata knows
    os.makedirs(ghost)
    with open(os.path.join(ghost, "00000000000000000000.log"), "wb") as f:
        f.write(b"not ours")

    disk = FailingDisk(a)
    second = manager(tmp_path, disk)  # starts: the failure is its directory's, not the broker's
    try:
        assert disk.refused and second.log_dirs[a].offline and not second.log_dirs[b].offline
        assert "ghost-0" in entries(a)  # not moved, not read
        live = second.topics["live"].partitions
        assert {p.log_dir.path for p in live} == {a, b}
        assert [p.log_dir.offline for p in live if p.log_dir.path == b] == [False]
    finally:
        second.close()

    third = manager(tmp_path)  # a healthy disk: set aside now, kept for an operator
    try:
        assert not third.log_dirs[a].offline
        assert "ghost-0" not in entries(a)
        assert any(e.startswith("ghost-0.") and e.endswith(STRAY_SUFFIX) for e in entries(a))
    finally:
        third.close()


def test_a_failed_fsync_after_setting_strays_aside_takes_the_directory_offline(tmp_path):
    a, _ = dirs(tmp_path)
    stray(a)
    disk = FailingDisk(a, fsyncs=True)
    topics = manager(tmp_path, disk)
    try:
        assert disk.refused == [a] and topics.log_dirs[a].offline
    finally:
        topics.close()


def test_a_replica_whose_set_aside_fails_is_never_read_as_the_topic_made_again(tmp_path):
    """The replica manager's path: a topic deleted while this broker was down comes back
    with a new id; the old replica is set aside and kept (``keep``). Its rename fails in one
    directory: that directory goes offline, the deletion holds, and the topic made again
    under the same name starts empty, in the directory still online; the old copy is set
    aside at the next start."""
    a, b = dirs(tmp_path)
    disk = FailingDisk(a)
    disk.armed = False
    topics = manager(tmp_path, disk)
    try:
        old = topics.create("t", 2, 1, {})
        old_id = old.topic_id
        on_a = next(p for p in old.partitions if p.log_dir.path == a)
        for p in old.partitions:  # what the old replica holds (its logs open when used)
            os.makedirs(p.dir)
            partition_metadata.write(OsDisk(), p.dir, old_id)
        disk.armed = True
        topics.delete("t", internal=True, keep=True)
        assert "t" not in topics.topics and topics.log_dirs[a].offline
        assert os.path.basename(on_a.dir) in entries(a)  # not renamed, not read
        assert any(e.endswith(STRAY_SUFFIX) for e in entries(b))  # b's copy set aside
        new = topics.ensure_replica_topic("t", uuid.uuid4(), 2, {})
        assert all(p.log_dir.path == b for p in new.partitions)
    finally:
        topics.close()

    again = manager(tmp_path)
    try:
        assert not again.log_dirs[a].offline
        assert not any(e.startswith("t-") and not e.endswith(STRAY_SUFFIX)
                       for e in entries(a))
        assert partition_metadata.read(OsDisk(), again.topics["t"].partitions[0].dir) in (
            None, again.topics["t"].topic_id)
    finally:
        again.close()


def test_a_leftover_that_cannot_be_set_aside_is_never_opened_as_the_new_topic(tmp_path):
    """A directory of the new topic's name already there (put by hand, or left by a copy)
    whose rename fails: its directory goes offline rather than the new partition opening
    the old files."""
    a, b = dirs(tmp_path)
    disk = FailingDisk(a)
    topics = manager(tmp_path, disk)
    try:
        left = os.path.join(a, "fresh-0")
        os.makedirs(left)
        partition_metadata.write(OsDisk(), left, uuid.uuid4())
        created = topics.create("fresh", 1, 1, {})
        [partition] = created.partitions
        assert partition.dir == left and topics.log_dirs[a].offline
        assert partition.log_dir.offline  # answered KAFKA_STORAGE_ERROR, never the old log
        assert not topics.log_dirs[b].offline
    finally:
        topics.close()


# --- a second review's finds: running out is no failure of a directory; a deletion nothing
# --- decided is refused, never answered and then undone by the next start

def test_out_of_descriptors_at_a_deletion_does_nothing_and_is_retriable(tmp_path):
    a, _ = dirs(tmp_path)
    disk = FailingDisk(a)
    disk.armed = False
    topics = manager(tmp_path, disk)
    try:
        other = topics.create("other", 1, 1, {})  # shares directory a
        doomed = topics.create("doomed", 2, 1, {})
        for p in (*other.partitions, *doomed.partitions):
            os.makedirs(p.dir)
        disk.no_descriptor = True
        try:
            topics.delete("doomed")
        except TopicError as exc:
            assert exc.error.name == "kafka_storage_error", exc
        else:
            raise AssertionError("a deletion without descriptors was answered")
        assert "doomed" in topics.topics and not topics.log_dirs[a].offline
        assert all(os.path.isdir(p.dir) for p in doomed.partitions)
        disk.no_descriptor = False
        topics.delete("doomed")  # the retry goes through
        assert "doomed" not in topics.topics and not topics.log_dirs[a].offline
    finally:
        topics.close()


def test_out_of_descriptors_on_the_fsync_after_strays_at_start_fails_the_start(tmp_path):
    a, _ = dirs(tmp_path)
    stray(a)
    disk = FailingDisk(a, fsyncs=True, error=errno.EMFILE)
    try:
        started = manager(tmp_path, disk)
    except OSError as exc:  # as listdir_at_start: never a start without a directory
        assert exc.errno == errno.EMFILE
    else:
        started.close()
        raise AssertionError("the start went on with a directory offline for want of a "
                             "descriptor")


def test_a_deletion_whose_renames_and_metadata_removal_fail_is_refused_and_kept(tmp_path):
    """One directory: every rename fails (the directory goes offline), and so does the
    metadata entry's removal, which decides a deletion no rename decided. Answered
    KAFKA_STORAGE_ERROR, the topic kept: the next start does not bring back a topic
    whose deletion was answered."""
    a, _ = dirs(tmp_path)
    disk = FailingDisk(a)
    disk.armed = False
    store = FailingStore(str(tmp_path / "meta"))
    topics = manager(tmp_path, disk, store, dirs="a")
    try:
        created = topics.create("t", 1, 1, {})
        os.makedirs(created.partitions[0].dir)
        disk.armed = store.armed = True
        try:
            topics.delete("t")
        except TopicError as exc:
            assert exc.error.name == "kafka_storage_error", exc
        else:
            raise AssertionError("a deletion nothing decided was answered")
        assert "t" in topics.topics and topics.log_dirs[a].offline
    finally:
        topics.close()


def test_a_deletion_decided_by_the_metadata_alone_stays_deleted(tmp_path):
    """Every rename fails, the metadata entry goes: the deletion holds, and the next start
    sets the directory left behind aside."""
    a, _ = dirs(tmp_path)
    disk = FailingDisk(a)
    disk.armed = False
    topics = manager(tmp_path, disk, dirs="a")
    try:
        created = topics.create("t", 1, 1, {})
        os.makedirs(created.partitions[0].dir)
        partition_metadata.write(OsDisk(), created.partitions[0].dir, created.topic_id)
        disk.armed = True
        topics.delete("t")
        assert "t" not in topics.topics and topics.log_dirs[a].offline
    finally:
        topics.close()
    again = manager(tmp_path, dirs="a")
    try:
        assert "t" not in again.topics and not again.log_dirs[a].offline
        assert "t-0" not in entries(a)
        assert any(e.startswith("t-0.") and e.endswith(STRAY_SUFFIX) for e in entries(a))
    finally:
        again.close()
