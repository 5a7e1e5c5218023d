"""The listening socket, bound before Hoard says anything.

``web.run_app`` binds only after the application's start-up hooks ran, so a
banner printed from one announced an endpoint that might never serve (a busy
port), with the credential to use it, followed by a traceback. Binding first,
here, makes the order right: bind, then announce, then serve; a port that
cannot be had is one line on stderr and exit status 1.
"""

from __future__ import annotations

import socket
import sys

from gateway.config import split_listen

EXIT_BIND = 1


def bind(listen: str, reuse_port: bool) -> socket.socket:
    """The listening socket (``reuse_port``: shared by worker processes).

    Raises ``SystemExit(1)`` after one line on stderr when the port cannot be had.
    """
    host, port = split_listen(listen)
    sock: socket.socket | None = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(1024)
        return sock
    except OSError as exc:
        if sock is not None:
            sock.close()
        print(f"hoard: cannot listen on {listen}: {exc.strerror or exc}", file=sys.stderr)
        raise SystemExit(EXIT_BIND) from None
