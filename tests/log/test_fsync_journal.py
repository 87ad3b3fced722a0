"""The fsync journal the power-loss tests cut files back to (ONCELOG_FSYNC_JOURNAL) says
exactly what was durable, whatever the order its threads' fsyncs end in."""

import os
import threading

from oncelog.log import disk as disk_module
from oncelog.log.disk import InstrumentedDisk, cut_to_journal

BOUND_S = 10


def test_a_slow_thread_never_journals_a_smaller_size_last(tmp_path, monkeypatch):
    """A worker thread's fsync reads the file's size, then the event loop appends, fsyncs
    (journalled) and acknowledges, then the worker's line lands: it must not cut away what
    the loop made durable (a CI run lost 14 acknowledged records so)."""
    journal, path = tmp_path / "journal", tmp_path / "data" / "0.log"
    path.parent.mkdir()
    disk = InstrumentedDisk(str(journal), None)
    fd = disk.open(str(path), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    disk.write(fd, b"a" * 100)
    worker_read_size, go_on = threading.Event(), threading.Event()
    real_fstat = os.fstat

    def fstat(f):  # the worker stops right after it read the size
        result = real_fstat(f)
        if threading.current_thread().name == "fsync-worker":
            worker_read_size.set()
            go_on.wait(BOUND_S)
        return result

    monkeypatch.setattr(disk_module.os, "fstat", fstat)
    worker = threading.Thread(target=disk.fdatasync, args=(disk.dup(fd),),
                              name="fsync-worker")
    worker.start()
    try:
        assert worker_read_size.wait(BOUND_S)
        disk.write(fd, b"b" * 50)
        disk.fsync(fd)  # the loop's own fsync: 150 bytes durable
    finally:
        go_on.set()
        worker.join(BOUND_S)
    assert not worker.is_alive()
    assert cut_to_journal(str(journal), str(path.parent)) == {str(path): 150}
    assert path.read_bytes() == b"a" * 100 + b"b" * 50


def test_truncation_unlink_and_rename_are_journalled(tmp_path):
    journal, directory = tmp_path / "journal", tmp_path / "data"
    directory.mkdir()
    disk = InstrumentedDisk(str(journal), None)
    a, b = str(directory / "a.log"), str(directory / "b.log")
    fd = disk.open(a, os.O_RDWR | os.O_CREAT, 0o644)
    disk.write(fd, b"x" * 100)
    disk.fsync(fd)
    disk.ftruncate(fd, 40)  # a recovery's cut: 40 at most survive
    disk.write(fd, b"y" * 20)  # written after, never fsynced
    disk.close(fd)
    assert cut_to_journal(str(journal), str(directory)) == {a: 40}

    fd = disk.open(b, os.O_RDWR | os.O_CREAT, 0o644)
    disk.write(fd, b"z" * 30)
    disk.fsync(fd)
    disk.close(fd)
    disk.rename(b, a)  # a's durable bytes are b's now
    assert cut_to_journal(str(journal), str(directory)) == {a: 30}
    disk.unlink(a)
    fd = disk.open(a, os.O_RDWR | os.O_CREAT, 0o644)  # the same name, a new file
    disk.write(fd, b"n" * 10)
    disk.close(fd)
    assert cut_to_journal(str(journal), str(directory)) == {a: 0}
