"""The metadata store's fetch lock: one lock file whose bytes are the stripes, exclusive
across processes (checked by a real second process) and across tasks of one process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from gateway.metadata.store import MetadataStore

SCOPE = ("origin", "bucket")
# A second process: for each offset read, whether it can lock that byte of the file now.
PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
for line in sys.stdin:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, int(line))
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, int(line))
        print("free", flush=True)
    except OSError:
        print("held", flush=True)
"""


class Probe:
    def __init__(self, lock_file: Path) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", PROBE, str(lock_file)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def __call__(self, offset: int) -> str:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(f"{offset}\n")
        self._proc.stdin.flush()
        return self._proc.stdout.readline().strip()

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(timeout=30)


async def test_a_held_stripe_is_held_for_other_processes_and_one_file_holds_them_all(
    tmp_path: Path,
) -> None:
    (tmp_path / "locks").mkdir()  # an older layout's stripe files: removed at start
    (tmp_path / "locks" / "meta-0001").touch()
    store = MetadataStore(tmp_path / "metadata.sqlite3", shared=True)
    await store.start()
    probe = Probe(tmp_path / "metadata.sqlite3.locks")
    try:
        key, listing = store.lock_offset(SCOPE, "a/k"), store.lock_offset(SCOPE, "a/", "list")
        assert probe(key) == "free"
        async with store.fetch_lock(SCOPE, "a/k"):
            assert probe(key) == "held" and probe(listing) == "free"
            async with store.fetch_lock(SCOPE, "a/", kind="list"):  # another kind: no wait
                assert probe(listing) == "held"
            assert probe(listing) == "free" and probe(key) == "held"
        assert probe(key) == "free"
    finally:
        probe.close()
        await store.close()
    assert not (tmp_path / "locks").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if "locks" in p.name) == [
        "metadata.sqlite3.locks"
    ]


async def test_tasks_of_one_process_take_a_stripe_in_turn(tmp_path: Path) -> None:
    """Record locks belong to the process: without the in-process queue, a second task
    would 'take' the byte at once, and the first one's unlock would free it for both."""
    store = MetadataStore(tmp_path / "metadata.sqlite3", shared=True)
    await store.start()
    probe = Probe(tmp_path / "metadata.sqlite3.locks")
    offset = store.lock_offset(SCOPE, "k")
    first_in, release_first, order = asyncio.Event(), asyncio.Event(), []

    async def first() -> None:
        async with store.fetch_lock(SCOPE, "k") as waited:
            assert not waited  # the stripe was free
            order.append("first")
            first_in.set()
            await release_first.wait()
        order.append("first out")

    async def second() -> None:
        await first_in.wait()
        async with store.fetch_lock(SCOPE, "k") as waited:
            assert waited  # it queued behind the first (a sibling's 404 may be news)
            order.append("second")
            assert probe(offset) == "held"  # the first one's unlock did not free it

    try:
        tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
        await first_in.wait()
        await asyncio.sleep(0)  # let the second task reach the lock and queue there
        assert order == ["first"]
        release_first.set()
        await asyncio.gather(*tasks)
        assert order == ["first", "first out", "second"] and probe(offset) == "free"
    finally:
        probe.close()
        await store.close()
