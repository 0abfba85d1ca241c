"""A network guard for every Python process of a test run: on PYTHONPATH, Python imports this at
start-up (site.py), before any user code, in place of any other sitecustomize (the project's
virtualenv has none).

With $NETGUARD_LOG set it appends one `load` line per process (pid, argv) and one `refused` line
per attempt to reach an address that is not this machine's, and refuses that attempt the way an
offline machine would (connection refused, name not known): a library that would phone home fails
fast and the log says who tried. Local means a loopback address, an address listed in
$NETGUARD_LOCAL (this machine's interfaces: Ray binds its node IP), or a name that means this
machine (see _local_names). UNIX sockets pass. C/C++ code (Ray's raylet and GCS, gRPC) does not
go through Python's socket module and is not seen here.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import sys
import traceback

LOG = os.environ.get("NETGUARD_LOG")
LOCAL_ADDRESSES = {a for a in os.environ.get("NETGUARD_LOCAL", "").split(",") if a}
LOCAL_NAMES: set[str] | None = None  # filled on first use


def _write(line: str) -> None:
    # One O_APPEND write per line: lines from concurrent processes never interleave.
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line.replace("\n", " | ") + "\n").encode("utf-8", "replace"))
    finally:
        os.close(fd)


def _is_local_ip(host: str) -> bool | None:
    """True/False for an IP literal, None for a name."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified or str(ip) in LOCAL_ADDRESSES


def _local_names() -> set[str]:
    """Names that mean this machine without asking DNS: localhost, the hostname, /etc/hosts
    entries for local addresses. Any other name is refused unresolved: a lookup alone tells a
    DNS server where the process wanted to go."""
    names = {"localhost", socket.gethostname().lower()}
    try:
        with open("/etc/hosts", encoding="utf-8") as f:
            for line in f:
                fields = line.split("#", 1)[0].split()
                if len(fields) > 1 and _is_local_ip(fields[0]):
                    names.update(name.lower() for name in fields[1:])
    except OSError:
        pass
    return names


def _is_local(host) -> bool:
    host = host.decode() if isinstance(host, bytes) else str(host)
    local = _is_local_ip(host)
    if local is not None:
        return local
    global LOCAL_NAMES
    if LOCAL_NAMES is None:
        LOCAL_NAMES = _local_names()
    host = host.lower().rstrip(".")
    return host == "" or host in LOCAL_NAMES or host.endswith(".localhost")


def _refuse(kind: str, where) -> None:
    frames = traceback.extract_stack()[:-2]  # innermost first, this guard's own frames left out
    stack = " < ".join(f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno} {f.name}"
                       for f in reversed(frames))
    _write(f"refused pid={os.getpid()} {kind} {where!r} argv={sys.argv!r} stack={stack}")


def _destination(sock, address):
    if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
        return address[0]
    return None  # AF_UNIX and friends never leave the machine


def _guard(kind: str, original, host_of, refusal):
    def guarded(*args, **kwargs):
        host = host_of(*args, **kwargs)
        if host is not None and not _is_local(host):
            _refuse(kind, host)
            return refusal(host)
        return original(*args, **kwargs)

    return guarded


def _connection_refused(host):
    raise ConnectionRefusedError(errno.ECONNREFUSED, f"netguard: {host!r} is not local")


def _name_unknown(host):
    raise socket.gaierror(socket.EAI_NONAME, f"netguard: {host!r} is not local")


def install() -> None:
    sock = socket.socket
    sock.connect = _guard("connect", sock.connect, _destination, _connection_refused)
    sock.connect_ex = _guard("connect_ex", sock.connect_ex, _destination,
                             lambda host: errno.ECONNREFUSED)
    sock.sendto = _guard("sendto", sock.sendto, lambda s, data, *rest: _destination(s, rest[-1]),
                         _connection_refused)
    # socket.create_connection, urllib3 and asyncio look names up through socket.getaddrinfo.
    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        setattr(socket, name, _guard(name, getattr(socket, name), lambda host, *_, **__: host,
                                     _name_unknown))
    _write(f"load pid={os.getpid()} ppid={os.getppid()} argv={sys.argv!r}")


if LOG:
    install()
