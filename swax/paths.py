"""Output folders checked before the work: every command that writes (train's run_dir, each
``swax eval`` command's --out, the sweep's out_dir, plot-run's PNG) calls
:func:`check_writable_dir` first, so an unwritable path is one error line naming it, before
minutes of training or evaluation rather than after."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import SwaxError


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
