"""One origin request per node for a storm of identical metadata misses over its workers.

Each worker coalesces its own identical misses (``metadata/memory.py``'s
flights); across workers, a listing page fetched by one is handed to the
others that asked for the same page meanwhile, as a flight is joined: under
the node's striped fetch lock for the page (``MetadataStore.fetch_lock``,
kind ``page``), a worker first looks for the page a sibling finished after
it asked, and only then asks the origin and leaves the page in
``cache.dir/node/pages/`` for the siblings waiting behind it.

A HEAD of a key is coalesced by the same lock (``MetadataSource._stored_or``),
and a found object is then in the node's metadata store; a missing one is not,
so the worker that learned it is missing leaves that here too
(``leave_missing``), with the journal's ``seq`` read before its origin request.
A sibling answers the same 404 (``raise_missing``) for as long as its own
negative entry would have lived, unless the journal knows of a write of the
key after that ``seq``: the node's 404 is one answer, as a found object is.

A page found is exactly what joining the sibling's flight would have given:
it was still being fetched when this worker asked. Older pages are never
used (they are the metadata cache's business, with its TTLs), and files
older than ``KEEP`` seconds are removed now and then (so a negative TTL
longer than ``KEEP`` is shared for ``KEEP`` at most: then each worker asks):
every ``SWEEP_EVERY`` writes, and a little after ``KEEP`` once writes stop, so
the pages of a listing (one file per 1,000 keys) do not stay on disk after it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gateway.core import errors
from gateway.metadata import codec
from gateway.metadata.store import MetadataStore
from gateway.origins.base import ListPage

KEEP = 30.0  # seconds a page file stays for siblings (they only want it while they wait)
SWEEP_EVERY = 64  # pages written between sweeps of old files
_SLACK = 1.0  # seconds past KEEP before the sweep that follows the last write


class SharedPages:
    def __init__(self, directory: Path, store: MetadataStore) -> None:
        self._directory = directory
        self._prefix = f"{directory}{os.sep}"  # file names are joined as text: a cold GET's cost
        self._store = store
        self._written = 0
        self._sweep_timer: asyncio.TimerHandle | None = None

    async def fetch(
        self, scope: tuple[str, str], query: tuple[str, str, str, int],
        fetch: Callable[[], Awaitable[ListPage]],
    ) -> ListPage:  # fmt: skip
        """The page ``query`` (prefix, delimiter, start after, max keys) of ``scope``."""
        name = "\0".join((*scope, *map(str, query)))
        path = self._path(name)
        asked = time.time()
        async with self._store.fetch_lock(scope, name, kind="page"):
            found = await asyncio.to_thread(_read, path, name, asked)
            if found is not None:
                return found
            page = await fetch()
            await asyncio.to_thread(self._write, path, name, codec.jsonable(page))
            self._sweep_later()
            return page

    def leave_missing(
        self, scope: tuple[str, str], key: str, missing: errors.NotFound, learned: int
    ) -> None:
        """``key`` was just found missing (under its fetch lock), asked at journal
        ``seq`` ``learned``: tell the siblings."""
        name = "\0".join((*scope, key, "missing"))
        if isinstance(missing, errors.NoSuchBucket):
            answer = {"bucket": missing.bucket, "learned": learned}
        elif isinstance(missing, errors.NoSuchKey):
            answer = {"key": missing.key, "headers": missing.headers, "learned": learned}
        else:
            return
        self._write(self._path(name), name, answer)
        self._sweep_later()

    def raise_missing(
        self, scope: tuple[str, str], key: str, since: float, believable: Callable[[int], bool]
    ) -> None:
        """Raise the 404 a sibling learned of ``key`` after ``since``, if it did and
        ``believable(learned)`` (no write of the key since it asked)."""
        name = "\0".join((*scope, key, "missing"))
        record = _record(self._path(name), name, since)
        if record is None:
            return
        answer, age = record["answer"], max(0.0, time.time() - record["done"])
        if not isinstance(answer.get("learned"), int) or not believable(answer["learned"]):
            return
        if "bucket" in answer:
            raise errors.NoSuchBucket(answer["bucket"])
        raise errors.NoSuchKey(answer["key"], answer["headers"], age=age)

    def _sweep_later(self) -> None:
        """Sweep once what was just written is past ``KEEP``, and again while files are
        left: answers are removed even when nothing is written after them."""
        if self._sweep_timer is None:
            loop = asyncio.get_running_loop()
            self._sweep_timer = loop.call_later(KEEP + _SLACK, self._timed_sweep)

    def _timed_sweep(self) -> None:
        self._sweep_timer = None
        if _sweep(self._directory, time.time() - KEEP):
            self._sweep_later()

    def _path(self, name: str) -> str:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{self._prefix}{digest[:32]}.json"

    def _write(self, path: str, name: str, answer: object) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as out:
            out.write(json.dumps({"name": name, "done": time.time(), "answer": answer}))
        os.replace(tmp, path)
        self._written += 1
        if self._written % SWEEP_EVERY == 0:
            _sweep(self._directory, time.time() - KEEP)


def _read(path: str, name: str, asked: float) -> ListPage | None:
    """The page a sibling finished fetching after ``asked``, if there is one."""
    record = _record(path, name, asked)
    try:
        return None if record is None else codec.page_from(record["answer"])
    except (ValueError, KeyError, TypeError):
        return None


def _record(path: str, name: str, since: float) -> dict[str, Any] | None:
    """The record (answer, when done) of ``name`` a sibling left after ``since``."""
    try:
        with open(path, "rb") as found:  # usually there is none: one failing open
            record = json.loads(found.read())
        if record["name"] != name or not record["done"] >= since:
            return None
        if not isinstance(record["answer"], dict):
            return None
        return record
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _sweep(directory: Path, before: float) -> int:
    """Remove the files last written before ``before``; how many are left."""
    left = 0
    for path in directory.glob("*.json"):
        try:
            if path.stat().st_mtime < before:
                path.unlink()
            else:
                left += 1
        except OSError:  # removed by a sibling's sweep meanwhile
            continue
    return left
