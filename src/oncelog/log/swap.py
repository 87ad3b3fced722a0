"""Putting a cleaned segment in place of the segments it replaces, so that a crash or a power
cut at any point leaves either the old segments or the cleaned one, never a mix.

Kafka writes ``.cleaned`` files, renames them ``.swap``, deletes the old segments, then drops
the suffix; here the one decisive step is a small manifest, because a cleaned segment alone
cannot say which old segments it replaces (its last batches may all have been cleaned away,
so its end says nothing of where the old ones ended). The steps for a group of segments whose
first base offset is B and which ends where the next segment begins, at E:

1. ``B.log.cleaned``, ``B.index.cleaned``, ``B.timeindex.cleaned``, ``B.txnindex.cleaned``
   (always, even empty) written and fsynced, and the directory fsynced (their names
   durable). A crash here: opening deletes them.
2. The manifest ``B.swap`` (holding E) written atomically (a fsynced temporary file renamed,
   the directory fsynced). This is the commit: from here the swap is rolled forward.
3. ``complete``: the old segments with bases in (B, E) removed (their log files first), the
   indexes then the log renamed from ``.cleaned`` over B's names, the directory fsynced,
   the manifest removed, the directory fsynced again.

Opening a log runs ``complete`` for every manifest it finds before reading any segment; each
step is safe to repeat whatever part of it a crash (or a power cut undoing renames that were
not yet fsynced in their directory) left done, so it converges on the cleaned segment.
"""

from __future__ import annotations

import contextlib
import os

from .disk import LogDirFailure, OsDisk, read_file, replace_file
from .segment import segment_files, segment_name

CLEANED = ".cleaned"
MANIFEST = ".swap"


def manifest_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, segment_name(base_offset) + MANIFEST)


def commit(disk: OsDisk, directory: str, base_offset: int, end_offset: int,
           dir_fd: int) -> None:
    """Step 2, ``dir_fd`` a descriptor of ``directory`` taken before (disk.open_dir), so
    that running out of descriptors (EMFILE) can only come before the decisive rename.
    Returns: the swap is decided. OSError: it is not, and nothing of it is left but the
    ``.cleaned`` files. LogDirFailure: nobody can say (the manifest was renamed into place
    but the directory fsync failed), so nothing may be undone; the next start decides by
    what it finds."""
    replace_file(disk, manifest_path(directory, base_offset), b"%d\n" % end_offset)
    try:
        disk.fsync_open_dir(dir_fd)
    except OSError as exc:
        raise LogDirFailure(f"{directory}: fsync after committing the swap of a cleaned "
                            f"segment failed: {exc}") from exc


def pending(disk: OsDisk, directory: str, names: list[str]) -> list[tuple[int, int]]:
    """(B, E) of every committed swap in ``directory`` not completed yet."""
    found = []
    for name in names:
        stem = name[:-len(MANIFEST)]
        if name.endswith(MANIFEST) and stem.isdigit():
            text = read_file(disk, os.path.join(directory, name))
            try:
                end = int(text.decode("ascii").strip())
            except (UnicodeDecodeError, ValueError):
                # Written atomically, so never torn: this is damage, and guessing which
                # segments it replaced could lose data. The operator must look.
                raise OSError(f"{directory}/{name}: unreadable swap manifest {text[:40]!r}; "
                              "the partition cannot be opened until it is repaired") from None
            found.append((int(stem), end))
    return sorted(found)


def complete(disk: OsDisk, directory: str, base_offset: int, end_offset: int,
             dir_fd: int | None = None, names: list[str] | None = None) -> None:
    """Step 3, from wherever a previous attempt stopped. OSError when the disk fails. Right
    after the commit, ``dir_fd`` (the directory's descriptor) and ``names`` (the old
    segments' log files) spare it the descriptors that listing and fsyncing the directory
    would take; at open, it looks."""
    def sync() -> None:
        if dir_fd is None:
            disk.fsync_dir(directory)
        else:
            disk.fsync_open_dir(dir_fd)

    for name in disk.listdir(directory) if names is None else names:
        stem = name[:-4]
        if name.endswith(".log") and stem.isdigit() and \
                base_offset < int(stem) < end_offset:
            for path in segment_files(directory, int(stem)):  # the log first
                with contextlib.suppress(FileNotFoundError):
                    disk.unlink(path)
    cleaned_log, *cleaned_indexes = segment_files(directory, base_offset, CLEANED)
    final_log, *final_indexes = segment_files(directory, base_offset)
    *rebuilt, cleaned_txn = cleaned_indexes
    *rebuilt_final, final_txn = final_indexes
    if disk.exists(cleaned_log):
        # The aborted transaction index cannot be rebuilt from the segment alone: it was
        # written for certain, so when it is missing it was renamed already and stays.
        if disk.exists(cleaned_txn):
            disk.rename(cleaned_txn, final_txn)
        for cleaned, final in zip(rebuilt, rebuilt_final, strict=True):
            if disk.exists(cleaned):
                disk.rename(cleaned, final)
            else:
                # Renamed already, or never written: either way not to be trusted with a log
                # that is about to change; the segment rebuilds it on open.
                with contextlib.suppress(FileNotFoundError):
                    disk.unlink(final)
        disk.rename(cleaned_log, final_log)
    sync()
    disk.unlink(manifest_path(directory, base_offset))
    sync()
