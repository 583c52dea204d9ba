"""A size-limited filesystem to fill, for the full-disk campaign (``tools.disk_full``).

The filesystem is a tmpfs of a given size, mounted in a mount namespace of its own: as
root a mount namespace alone; otherwise also a user namespace that maps the caller to root
inside (unprivileged user namespaces, on by default in current Linux distributions). The
mount is private to the processes started inside, and it vanishes with the last of them,
even after a SIGKILL: nothing is left mounted on the host.

``Ballast`` fills it as another program filling the disk would: one file takes every free
block, so the next write of anyone on it fails with ENOSPC; deleting the file gives the
space back.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Set in the environment of the process that runs inside the namespace.
INSIDE_ENV = "CALLGATE_SMALL_DISK_NAMESPACE"
_CHUNKS = (1 << 20, 1 << 12)  # fill with MiB writes, then the last pages one by one


def namespace_argv() -> list[str]:
    """The ``unshare`` command line that runs a command in a mount namespace of its own."""
    argv = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        argv += ["--user", "--map-root-user"]
    return [*argv, "--"]


def unavailable() -> str | None:
    """Why no size-limited filesystem can be mounted here (``None``: one can)."""
    if sys.platform != "linux":
        return f"a tmpfs in a mount namespace needs Linux, not {sys.platform}"
    for tool in ("unshare", "mount"):
        if shutil.which(tool) is None:
            return f"no {tool!r} command (util-linux) on PATH"
    with tempfile.TemporaryDirectory(prefix="callgate-disk-probe-") as where:
        probe = [*namespace_argv(), "mount", "-t", "tmpfs", "-o", "size=1m", "probe", where]
        try:
            run = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(probe)}: {exc}"
    if run.returncode != 0:
        return f"{' '.join(probe)} failed: {run.stderr.strip() or run.returncode}"
    return None


def mount_tmpfs(path: Path, size_mb: int) -> None:
    """Mount a tmpfs of ``size_mb`` MiB at ``path`` (inside the namespace)."""
    if os.environ.get(INSIDE_ENV) != "1":
        raise RuntimeError(
            "mount_tmpfs runs inside namespace_argv() only (it would mount on the host)"
        )
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size_mb}m,mode=0755"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "callgate-disk", str(path)], check=True)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class Ballast:
    """A file that takes every free block of its filesystem (``fill``) until ``release``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0

    def fill(self) -> int:
        """Write until the filesystem refuses (ENOSPC); returns the bytes taken."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            try:  # most of it at once: the others' writes meet a full disk, not a filling one
                os.posix_fallocate(fd, 0, free_bytes(self.path.parent))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
            self.size = os.fstat(fd).st_size
            for chunk in _CHUNKS:
                block = b"\0" * chunk
                while True:
                    try:
                        self.size += os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        return self.size

    def release(self) -> None:
        """Give the space back."""
        self.path.unlink(missing_ok=True)
        self.size = 0
