"""Which of the ports `rackserve up` will bind are taken, and by which process.

The launcher checks every port before it starts anything, so a second `rackserve up` on a port
another cluster holds fails at once with the port and the holder's PID, not after a restart loop.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"  # TCP state code in /proc/net/tcp


class PortInUse(OSError):
    """A port the launcher needs is taken; the message names the port and its holder."""


def in_use(host: str, port: int) -> bool:
    """True when `port` on `host` cannot be bound now (the way uvicorn and gRPC bind it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def _listening_inodes(port: int) -> set[int]:
    inodes = set()
    for table in _TCP_TABLES:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(fields[9]))
    return inodes


def holder(port: int) -> str:
    """'pid N (command line)' of the process listening on `port`, or why it cannot be named."""
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not inodes:
        return "a process not visible here"
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _fd_links(proc) & inodes:
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                cmd = "?"
            return f"pid {proc.name} ({cmd.strip()[:120]})"
    return "a process of another user"


def _fd_links(proc: Path) -> set[str]:
    """What the open fds of /proc/<pid> point at (empty when not readable)."""
    links = set()
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:
        return links
    for fd in fds:
        try:
            links.add(os.readlink(fd))
        except OSError:  # closed meanwhile
            continue
    return links


def check_free(host: str, ports: dict[str, int]) -> None:
    """Raise PortInUse naming every taken port of `ports` (what -> port) and its holder."""
    taken = [
        f"{what} port {port} on {host} is in use by {holder(port)}"
        for what, port in ports.items()
        if port and in_use(host, port)
    ]
    if taken:
        hint = "; stop that process or pass another --port"
        raise PortInUse("; ".join(taken) + hint)
