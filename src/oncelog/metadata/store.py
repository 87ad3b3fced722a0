"""The cluster metadata store: versioned values under paths, changed by compare-and-set.

The interface is ZooKeeper's shape kept small (get with version, set if version matches,
delete, list children) so a ZooKeeper store can implement it later. The embedded default,
LocalFileStore, keeps one JSON file per path, each written atomically (temp file, fsync,
rename) under an exclusive lock so two processes sharing the directory cannot interleave.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, Protocol

NO_VERSION = -1  # expected version of a path that must not exist yet


class BadVersion(Exception):
    """compare_and_set lost a race: the stored version is not the expected one."""


class MetadataUnavailable(Exception):
    """A store kept elsewhere (ZooKeeper) did not answer in time: try again later."""


class StillContended(MetadataUnavailable):
    """A compare-and-set lost its race until the deadline: retriable, as ZooKeeper away is."""


# Every lost race means another writer's compare-and-set succeeded, so the cluster always
# progresses; one writer can still lose many in a row when several hammer one path. The bound
# is therefore time, not a count of attempts, and a lost race backs off a little with jitter.
RACE_DEADLINE_S = 30.0
_BACKOFF_FIRST_S = 0.001
_BACKOFF_MAX_S = 0.05
_clock: Callable[[], float] = time.monotonic  # module seams, so a test can run the clock
_sleep: Callable[[float], None] = time.sleep


def race_attempts(what: str, deadline_s: float = RACE_DEADLINE_S) -> Iterator[int]:
    """Attempts at one read-then-compare-and-set: the caller ``continue``s after BadVersion
    and returns once it won. Between attempts a growing, jittered pause (seeded by the
    process id: it spreads writers in time and decides nothing); past the deadline
    StillContended."""
    rng = random.Random(os.getpid())
    deadline = _clock() + deadline_s
    pause = _BACKOFF_FIRST_S
    attempt = 0
    while True:
        yield attempt
        attempt += 1
        if _clock() >= deadline:
            raise StillContended(f"could not {what}: lost {attempt} races in "
                                 f"{deadline_s:.0f} s")
        _sleep(rng.uniform(0, pause))
        pause = min(pause * 2, _BACKOFF_MAX_S)


class MetadataStore(Protocol):
    def get(self, path: str) -> tuple[Any, int]:
        """(value, version); (None, NO_VERSION) when the path does not exist."""

    def compare_and_set(self, path: str, value: Any, expected_version: int) -> int:
        """Store ``value`` if the path is at ``expected_version``; returns the new version."""

    def delete(self, path: str, expected_version: int | None = None) -> None: ...

    def children(self, prefix: str) -> list[str]: ...


class LocalFileStore:
    def __init__(self, directory: str) -> None:
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self._lock_path = os.path.join(directory, ".lock")

    def _file(self, path: str) -> str:
        return os.path.join(self.dir, _file_name(path))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self._lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self, path: str) -> tuple[Any, int]:
        try:
            with open(self._file(path), encoding="utf-8") as f:
                stored = json.load(f)
        except FileNotFoundError:
            return None, NO_VERSION
        return stored["value"], stored["version"]

    def get(self, path: str) -> tuple[Any, int]:
        return self._read(path)

    def compare_and_set(self, path: str, value: Any, expected_version: int) -> int:
        with self._locked():
            _, version = self._read(path)
            if version != expected_version:
                raise BadVersion(f"{path}: version is {version}, expected {expected_version}")
            new_version = version + 1
            target = self._file(path)
            tmp = os.path.join(self.dir, _TMP)  # one at a time: under the lock
            stored = {"version": new_version, "value": value}
            if _is_hashed(os.path.basename(target)):
                stored["path"] = path
            try:
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump(stored, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)
            except BaseException:
                # Nothing changed; a partial temporary file would only hold space a full
                # disk needs back.
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self._sync_dir()
            return new_version

    def _sync_dir(self) -> None:
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def delete(self, path: str, expected_version: int | None = None) -> None:
        with self._locked():
            _, version = self._read(path)
            if expected_version is not None and version != expected_version:
                raise BadVersion(f"{path}: version is {version}, expected {expected_version}")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._file(path))
                self._sync_dir()

    def children(self, prefix: str) -> list[str]:
        quoted = urllib.parse.quote(prefix.rstrip("/") + "/", safe="")
        names = []
        for name in os.listdir(self.dir):
            if not (name.startswith(quoted) and name.endswith(".json")):
                continue
            if _is_hashed(name):
                with open(os.path.join(self.dir, name), encoding="utf-8") as f:
                    names.append(json.load(f)["path"][len(prefix.rstrip("/")) + 1:])
            else:
                names.append(urllib.parse.unquote(name[len(quoted):-5]))
        return sorted(names)


# A file name holds at most 255 bytes. A path whose quoted name would not fit (a topic of
# more than 241 characters under "topics/") is kept in a file named by the start of its
# quoted name and a hash of the whole, the path itself stored inside.
_NAME_MAX = 255
_KEEP = 200
_HASHED = re.compile(rf".{{{_KEEP}}}~[0-9a-f]{{40}}\.json")
_TMP = ".pending.json.tmp"


def _file_name(path: str) -> str:
    quoted = urllib.parse.quote(path, safe="")
    if len(quoted) + len(".json") <= _NAME_MAX and not _HASHED.fullmatch(quoted + ".json"):
        return quoted + ".json"
    digest = hashlib.sha1(path.encode()).hexdigest()
    return f"{quoted[:_KEEP]}~{digest}.json"


def _is_hashed(name: str) -> bool:
    return _HASHED.fullmatch(name) is not None
