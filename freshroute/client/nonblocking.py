"""The blocking drivers' sockets to read ports, non-blocking once connected: ``select()`` says a socket is readable when
bytes arrived, and over TLS those bytes may hold no data yet (a record not whole, or a session ticket the server sends
after the handshake) — a blocking read would then wait for an answer that may never come on that connection.
"""

from __future__ import annotations

import socket
import ssl

_WAITING = (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError)


def connected(sock: socket.socket) -> socket.socket:
    """``sock``, its connection (and handshake) done, switched to non-blocking."""
    sock.setblocking(False)
    return sock


def receive(sock: socket.socket) -> bytes | None:
    """What a socket ``select()`` found readable holds: its bytes, None while it holds no data yet, b"" once the peer
    has closed it. Raises OSError."""
    try:
        data = sock.recv(1 << 16)
    except _WAITING:
        return None
    if data and isinstance(sock, ssl.SSLSocket):
        while sock.pending():  # decrypted already, so select() would not report it
            data += sock.recv(1 << 16)
    return data


def send(sock: socket.socket, data: bytes, timeout_s: float) -> None:
    """All of ``data``: at once where the send buffer has room (nearly always: a frame is small), else waiting for it
    at most ``timeout_s``. Raises OSError."""
    try:
        sent = sock.send(data)
    except _WAITING:
        sent = 0
    if sent < len(data):
        sock.settimeout(timeout_s)
        try:
            sock.sendall(data[sent:])
        finally:
            sock.setblocking(False)
