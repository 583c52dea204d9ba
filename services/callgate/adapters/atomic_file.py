"""Files of the state directory written whole or not at all (ADR 0084).

A write on a full disk (ENOSPC), past the kernel's file-size limit (EFBIG) or cut short by
a crash must not leave a key, a JWKS document or a stored position half written: the bytes
go to a temporary file in the same directory and reach the disk (fsync) before a rename,
atomic within one filesystem, puts them in place. A failure leaves the old file as it was
and removes the temporary one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int) -> None:
    """``path`` holds ``data`` (with ``mode``) or, when this raises, what it held before."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # The rename itself reaches the disk with its directory; it is in place either way.
    with contextlib.suppress(OSError):
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
