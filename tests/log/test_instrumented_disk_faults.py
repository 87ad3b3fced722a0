"""ONCELOG_DISK_FAULTS (log/disk.InstrumentedDisk), the test disk of the broker processes:
``SLOW<ms>`` delays an operation and never fails it, ``SLOW0`` included (it raised
OSError(0)); an errno name fails it once it has succeeded ``after`` times."""

from __future__ import annotations

import os

import pytest

from oncelog.log.disk import InstrumentedDisk


def test_slow_faults_delay_and_errno_faults_fail(tmp_path):
    disk = InstrumentedDisk(None, "fsync:a.log:0:SLOW0;fsync:b.log:0:SLOW1;fsync:c.log:1:EIO")
    fds = [disk.open(str(tmp_path / name), os.O_RDWR | os.O_CREAT)
           for name in ("a.log", "b.log", "c.log")]
    try:
        for _ in range(2):
            disk.fsync(fds[0])
            disk.fsync(fds[1])
        disk.fsync(fds[2])
        with pytest.raises(OSError) as failed:
            disk.fsync(fds[2])
        assert failed.value.errno == 5
    finally:
        for fd in fds:
            disk.close(fd)
