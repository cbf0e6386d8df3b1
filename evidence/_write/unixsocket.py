"""The service's Unix socket file: bound with mode 0600 before it listens (no other user can
connect), a stale file left by a killed service replaced, a live service's refused.

Apart from the service because it is about a path in the file system, not about clients:
what can be at that path, and how to tell a dead socket from a live one.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

from .._errors import ServiceError

__all__ = ["bind_unix", "socket_is_live"]


def bind_unix(path: Path) -> socket.socket:
    """A Unix socket at ``path``, mode 0600 before it listens (so no other user can connect).

    A socket file left by a killed service is replaced; one with a live service behind it,
    or a path that is not a socket, is refused.
    """
    if len(os.fsencode(path)) > 107:
        raise ServiceError(f"{path}: a Unix socket path must be under 108 bytes",
                           hint="use a shorter path, e.g. under /run or /tmp")
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise ServiceError(f"{path} exists and is not a socket", path=str(path))
        if socket_is_live(path):
            raise ServiceError(f"{path}: another service is listening there", path=str(path),
                               hint="stop it first, or choose another --socket path")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        os.chmod(path, 0o600)  # before listen(): until then every connect() is refused
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ServiceError(f"{path}: cannot listen ({exc.strerror})", path=str(path)) from None
    return sock


def socket_is_live(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(os.fspath(path))
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        raise ServiceError(f"{path}: cannot tell whether a service is listening there "
                           f"({exc.strerror})", path=str(path)) from None
    finally:
        probe.close()
    return True
