"""The uvloop sendfile path: the thread that finishes a large segment owns its descriptors."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from gateway.pieces import FileSegment
from gateway.s3.body import BodySender, _Release

SIZE = 16 * 1024 * 1024  # far more than a socket buffer: the rest goes to the thread


async def test_a_cancelled_send_leaves_the_thread_its_own_descriptors(tmp_path: Path) -> None:
    block = tmp_path / "block"
    block.write_bytes(os.urandom(SIZE))
    open_before = len(os.listdir("/proc/self/fd"))
    fd = os.open(block, os.O_RDONLY)
    server, client = socket.socketpair()
    server.setblocking(False)
    released = asyncio.Event()
    sender = BodySender(threads=1)
    loop = asyncio.get_running_loop()
    release = _Release(released.set)
    sending = asyncio.ensure_future(
        sender._direct(loop, server.fileno(), FileSegment(fd, 0, SIZE, released.set), release)
    )
    try:
        while not release._handed:  # the socket buffer filled: the thread took the rest
            await asyncio.sleep(0)
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        # What a cancelled handler's caller does next: close the block file and the
        # socket; their numbers are free for the next connection at once.
        os.close(fd)
        server.close()
        reused, peer = socket.socketpair()
        await asyncio.wait_for(released.wait(), 30)  # the lease ends with the thread
        peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            peer.recv(1)  # nothing of the block went to whatever took the old numbers
        reused.close()
        peer.close()
        assert len(os.listdir("/proc/self/fd")) == open_before + 1  # client; the copies closed
        received = await asyncio.to_thread(_drain, client)
        assert received < SIZE  # cut: the connection was shut down, not finished
    finally:
        client.close()
        sender.close()


def _drain(sock: socket.socket) -> int:
    total = 0
    while chunk := sock.recv(1 << 20):
        total += len(chunk)
    return total
