"""Output files the command-line tools write: a regular file, or a path that does not exist yet.

bmoe-batch writes its results beside ``--out`` and renames them over it, and bmoe-eval appends to
and replaces the files in its ``--out`` folder. Either would turn a device, a FIFO or a socket
into a regular file (run as root, ``--out /dev/null`` would replace the system's), or block on a
FIFO, so such a path is refused before any work.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists and is not a regular file (a link is followed), else None."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None  # a new file (or a link to one not made yet)
    except OSError:
        return None  # cannot be looked at: writing it says why
    if stat.S_ISREG(mode):
        return None
    for test, what in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return what
    return "not a regular file"
