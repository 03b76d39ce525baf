"""Output folders checked before the work: every command that writes (train's run_dir, each
``swax eval`` command's --out, the sweep's out_dir, plot-run's PNG) calls
:func:`check_writable_dir` first, so an unwritable path is one error line naming it, before
minutes of training or evaluation rather than after. The ``swax eval`` commands then call
:func:`check_output_dir`: a folder of earlier results is refused unless ``--overwrite`` is
given (then they are removed first), so results of two runs are never mixed."""

from __future__ import annotations

import fnmatch
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from swax.core.errors import DiskFullError, SwaxError, is_disk_full


def check_writable_dir(path: str | Path, what: str, keep: bool = False) -> Path:
    """Check that files can be written in the folder ``path``: its missing folders are made and
    a temporary file is written there and removed (nothing already there is touched). With
    ``keep=False`` the folders this made are removed again (the command makes them when it
    writes), so a command that fails later leaves no trace. A path under a file, on a
    read-only file system or in a folder without permission is a SwaxError naming ``what``
    (e.g. "run_dir" or "--out") and the path. Returns the path."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise SwaxError(f"{what} {path} exists and is not a folder")
    made = [q for q in (p, *p.parents) if not q.exists()]
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".swax-write-test-", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        if isinstance(e, (NotADirectoryError, FileExistsError)):
            reason = "a part of the path is a file, not a folder"
        raise SwaxError(f"{what} {path} is not writable: {reason}") from None
    finally:
        if not keep:
            for q in made:  # deepest first; only folders this made and left empty
                try:
                    q.rmdir()
                except OSError:
                    break
    return p


def _matches(parts: tuple[str, ...], patterns: Sequence[str]) -> bool:
    """Whether a relative path (its parts) matches one of the glob ``patterns`` ("results.json",
    "pred/*.jsonl"): part by part, so ``*`` never crosses a folder."""
    for pat in patterns:
        pp = tuple(pat.split("/"))
        if len(pp) == len(parts) and all(map(fnmatch.fnmatchcase, parts, pp)):
            return True
    return False


def _sort_entries(folder: Path, outputs: Sequence[str]) -> tuple[list[Path], list[Path]]:
    """(entries of ``folder`` that match ``outputs``, entries that do not), relative to it.
    Files and links are matched by their path, a folder by its contents; an empty folder is
    neither when an output pattern lies inside it (``pred`` of "pred/*.jsonl"), else it is
    foreign. Links are never followed."""
    ours: list[Path] = []
    foreign: list[Path] = []
    out_dirs = {tuple(pat.split("/")[:i]) for pat in outputs for i in range(1, pat.count("/") + 1)}
    for root, dirs, files in os.walk(folder):
        here = Path(root).relative_to(folder)
        for name in sorted(dirs):
            if os.path.islink(os.path.join(root, name)):
                files.append(name)  # a link to a folder: an entry of its own, not walked
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(root, d)))
        if here.parts and not dirs and not files and here.parts not in out_dirs:
            foreign.append(here)  # (an empty folder of outputs holds no results: left alone)
        for name in sorted(files):
            rel = here / name
            (ours if _matches(rel.parts, outputs) else foreign).append(rel)
    return ours, foreign


def check_output_dir(
    path: str | Path,
    what: str,
    outputs: Sequence[str],
    writer: str,
    overwrite: bool = False,
    noun: str = "results",
) -> Path:
    """Check an output folder before the work, as ``swax data prepare`` checks its ``--out``:
    writable (:func:`check_writable_dir`), and empty or new, unless ``overwrite`` is given and
    it holds only earlier results of the same command, which are then removed (so old and new
    results are never mixed). ``outputs`` are the paths the command writes, relative to the
    folder, as glob patterns ("results.json", "summary-*.csv", "pred/*.jsonl"); ``writer`` names
    the command in the messages ("swax eval niah"), ``noun`` what it writes. A folder holding
    anything else is refused even with ``overwrite``: no file the command does not write is
    ever deleted. Errors are SwaxErrors naming ``what`` (e.g. "--out") and the path. Returns
    the path."""
    p = check_writable_dir(path, what)
    if not p.is_dir():
        return p
    ours, foreign = _sort_entries(p, outputs)
    if foreign:
        raise SwaxError(
            f"{what} {path} holds files that {writer} does not write (e.g. {foreign[0]}); "
            f"choose an empty or new folder (--overwrite replaces only {writer}'s own {noun})"
        )
    if ours and not overwrite:
        raise SwaxError(
            f"{what} {path} already holds {noun} of {writer} (e.g. {ours[0]}); pass "
            "--overwrite to replace them, or choose another folder"
        )
    emptied: set[Path] = set()
    for rel in ours:
        (p / rel).unlink(missing_ok=True)
        emptied.update(d for d in rel.parents if d.parts)
    for rel in sorted(emptied, key=lambda r: len(r.parts), reverse=True):
        try:
            (p / rel).rmdir()  # the output folders this emptied (pred/), deepest first
        except OSError:
            pass
    return p


class writing:  # noqa: N801 (a context manager named for what it guards)
    """``with writing("checkpoint step_000008", path, cleanup=[tmp]):`` — a full disk while
    writing becomes one DiskFullError naming what was being written and where, after the paths
    in ``cleanup`` (the partial files or folders) are removed; other errors pass unchanged."""

    def __init__(self, what: str, path, cleanup: Sequence = ()):
        self.what, self.path, self.cleanup = what, path, list(cleanup)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if error is None or not is_disk_full(error):
            return False
        import shutil

        for p in self.cleanup:
            p = Path(p)
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        raise DiskFullError(
            f"no space left on the device writing {self.what} to {self.path}; what was saved "
            "before is intact: free some space and run again (a training run: with resume=auto)"
        ) from None
