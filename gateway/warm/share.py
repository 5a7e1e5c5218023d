"""One node's share of a warm job: enumerate the objects, fill the blocks this node owns.

Every node of a job walks the same objects in the same order and skips the
blocks another node owns (``BlockSource.owns``), so each block is fetched by
its owner only, through the fill path a client miss takes (one origin GET,
coalesced with a client's, written to the disk tier). Each node also looks up
every object's metadata as a cold read does, so that a read through any node
after warming needs nothing from the origin: on a single node a metadata miss
is answered by the ranged GET of block 0, whose response also fills that
block (no HEAD: a listing's entry lacks the Content-Type and user metadata a
GET must answer with); in a cluster the key's metadata owner answers it (one
HEAD per object per cluster).

The walk keeps at most ``concurrency`` blocks in flight. Objects finish out
of order; ``Progress.cursor`` is the first object not finished, and every
checkpoint records it with the counts before it, so a restart resumes there:
objects before it are not looked at again, objects after it that were done
find their blocks on disk and cost no origin request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from gateway.blocks.source import BlockSource
from gateway.cache.disk import DiskTier
from gateway.core import errors
from gateway.metadata.store import MetadataStore
from gateway.obs.metrics import Metrics
from gateway.pieces import BlockRef
from gateway.read.manifests import read_manifest
from gateway.read.reader import Reader
from gateway.warm.spec import Progress, WarmSpec
from gateway.warm.store import JobStore

log = logging.getLogger(__name__)

MAX_MANIFEST = 64 * 1024 * 1024  # bytes of a manifest object read into memory
_LIST_PAGE = 1000
_CHECKPOINT_EVERY = 1.0  # seconds between progress files while a share runs


@dataclass(frozen=True)
class WarmTiers:
    """What warm jobs fill, pin and flush, handed over by the wiring."""

    blocks: BlockSource
    disk: DiskTier | None  # pins live there; without it pinning is refused
    metadata: MetadataStore | None  # flushed at each checkpoint


class PinQuotaExceeded(Exception):
    """Pinning the next block would take the node's pinned bytes over ``cache.pin_quota``."""


class ShareRun:
    """Runs one share to its end; ``progress`` is read by status calls while it runs."""

    def __init__(self, job_id: str, spec: WarmSpec, progress: Progress, reader: Reader,
                 tiers: WarmTiers, store: JobStore, metrics: Metrics, concurrency: int, pin_quota: int) -> None:  # fmt: skip
        self.job_id = job_id
        self.spec = spec
        self.progress = progress
        self._reader = reader
        self._blocks = tiers.blocks
        self._tiers = tiers
        self._store = store
        self._metrics = metrics
        self._concurrency = concurrency
        self._pin_quota = pin_quota
        # Objects past the cursor that are done: (bytes, 1 if it failed else 0).
        self._finished: dict[int, tuple[int, int]] = {}
        self._saved = 0.0
        self._saved_counts = (-1, -1)
        self._saving = asyncio.Lock()
        self.interrupted = False  # set when the process stops: the share resumes on restart
        self._lines: list[int] | None = None  # a manifest's line number of each key

    async def run(self) -> None:
        """Run to done, failed or cancelled; the outcome is in ``progress``, saved."""
        progress = self.progress
        progress.state, progress.started = "running", progress.started or time.time()
        progress.resumed_at = (time.time(), progress.bytes_done)
        await self.save()
        try:
            await self._work()
        except asyncio.CancelledError:
            if not self.interrupted:
                progress.finish("cancelled", progress.reason or "cancelled")
            raise
        finally:
            await asyncio.shield(self.save())

    async def _work(self) -> None:
        progress = self.progress
        try:
            await self._walk(await self._items())
        except* PinQuotaExceeded as group:
            progress.finish("failed", str(_first(group)))
        except* (errors.HoardError, OSError, ValueError) as group:
            first = _first(group)
            progress.finish("failed", f"{type(first).__name__}: {first}")
        if progress.finished is None and progress.errors:
            progress.finish(
                "failed", f"{progress.errors} of {progress.objects_total} objects failed"
            )
        elif progress.finished is None:
            progress.finish("done")

    async def save(self) -> dict[str, Any]:
        """Checkpoint the progress; what was saved (a status may show no more than that:
        a sibling worker answers from the file)."""
        # One write at a time: a slower older snapshot must not land over a newer one.
        async with self._saving:
            if self._tiers.metadata is not None:
                # What the checkpoint calls done must be known after a kill -9 too: a
                # metadata row still pending would cost a GET per object after a restart.
                await self._tiers.metadata.flush()
            counts = (self.progress.objects_done, self.progress.bytes_done)
            shown = self.progress.to_json()
            await self._store.save(self.job_id, "share", {"spec": self.spec.to_json(),
                                                          "progress": shown})  # fmt: skip
            self._saved = time.monotonic()
            self._saved_counts = counts  # only once on disk: see save_shown
            return shown

    async def save_shown(self) -> dict[str, Any]:
        """The progress, saved first if it moved: what was shown survives even a kill -9,
        and a sibling worker reading the file never shows less."""
        if (self.progress.objects_done, self.progress.bytes_done) != self._saved_counts:
            return await self.save()
        return self.progress.to_json()

    # -- enumeration -------------------------------------------------------------------

    async def _items(self) -> list[tuple[str, int]]:
        """The objects to warm, as (key, size), saved before the first block is fetched."""
        items = await self._store.load_keys(self.job_id)
        if items is None:
            if self.progress.cursor:
                raise ValueError("the saved key list is gone: the job cannot resume")
            items = await self._enumerate()
            await self._store.save_keys(self.job_id, items)
        self.progress.objects_total = len(items)
        self.progress.bytes_total = sum(max(size, 0) for _, size in items)
        return items

    async def _enumerate(self) -> list[tuple[str, int]]:
        spec = self.spec
        if spec.prefix is not None:
            return await list_prefix(self._reader, spec.bucket, spec.prefix)
        keys = list(spec.keys) if spec.keys is not None else await self._manifest()
        return await self._sizes(keys)

    async def _manifest(self) -> list[str]:
        assert self.spec.manifest is not None
        data = await read_manifest(self._reader, self.spec.bucket, self.spec.manifest, MAX_MANIFEST)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            raise ValueError(f"manifest line {line} is not UTF-8 text") from None
        numbered = ((n, line.strip()) for n, line in enumerate(text.splitlines(), 1))
        found = [(n, key) for n, key in numbered if key and not key.startswith("#")]
        self._lines = [n for n, _ in found]
        return [key for _, key in found]

    def _sample(self, index: int, key: str, failure: BaseException) -> str:
        """An error sample: a manifest's keys by their line and error kind, never their text.

        A manifest is object content; echoing a line that is not a key (or an
        error message quoting it) would let a warm job read any object it can
        name. After a restart the lines are not known again: the entry's number
        stands in.
        """
        if self.spec.manifest is None:
            return f"{key}: {type(failure).__name__}: {failure}"
        if self._lines is not None and index < len(self._lines):
            return f"manifest line {self._lines[index]}: {type(failure).__name__}"
        return f"manifest entry {index + 1}: {type(failure).__name__}"

    async def _sizes(self, keys: list[str]) -> list[tuple[str, int]]:
        """Each key's size from its metadata; -1 where it cannot be had (reported later)."""
        slots = asyncio.Semaphore(self._concurrency)

        async def size(key: str) -> tuple[str, int]:
            async with slots:
                try:
                    return key, (await self._reader.head_object(self.spec.bucket, key)).size
                except errors.HoardError:
                    return key, -1

        return list(await asyncio.gather(*(size(key) for key in keys)))

    # -- the walk ----------------------------------------------------------------------

    async def _walk(self, items: list[tuple[str, int]]) -> None:
        objects = asyncio.Semaphore(self._concurrency)  # objects started, not yet finished
        blocks = asyncio.Semaphore(self._concurrency)  # origin GETs in flight
        async with asyncio.TaskGroup() as group:
            for index in range(self.progress.cursor, len(items)):
                await objects.acquire()
                task = group.create_task(self._object(index, items[index][0], blocks))
                task.add_done_callback(lambda _: objects.release())

    async def _object(self, index: int, key: str, slots: asyncio.Semaphore) -> None:
        done, failed = 0, 0
        try:
            looked = time.monotonic()
            async with slots:  # a cold lookup is an origin request: it takes a slot too
                refs = await self._reader.block_refs(self.spec.bucket, key)
            # A fill of block 0 that ran since the lookup began is the one the lookup's
            # GET started (or a reader's); it may have landed already (with workers > 1,
            # while the lookup flushed the metadata to the shared store), and must still
            # count as fetched, not as cached.
            filling = {r.block for r in refs[:1] if self._blocks.fills.ran_since(r.block, looked)}
            mine = [ref for ref in refs if self._blocks.owns(ref)]
            async with asyncio.TaskGroup() as group:
                for ref in mine:
                    await slots.acquire()
                    group.create_task(_released(slots, self._block(ref, ref.block in filling)))
            done = sum(ref.length for ref in mine)
        except* (errors.HoardError, OSError) as group:
            first = _first(group)
            self.progress.error(self._sample(index, key, first))
            failed = 1
        self.progress.objects_done += 1
        self._metrics.warm_objects.inc()
        await self._advance(index, (done, failed))

    async def _block(self, ref: BlockRef, filling: bool = False) -> None:
        """Warm one block; ``filling``: its fill was already running when it was looked up."""
        if self.spec.pin and self._tiers.disk is not None:
            expires = self.progress.created + self.spec.pin_ttl
            if not await self._tiers.disk.pin(self.job_id, ref.block, ref.length, expires,
                                               self._pin_quota):  # fmt: skip
                pinned = self._tiers.disk.stats().pinned_bytes
                raise PinQuotaExceeded(
                    f"pin quota exceeded: cache.pin_quota is {self._pin_quota} bytes on this "
                    f"node and {pinned} are pinned; unpin other jobs or raise cache.pin_quota"
                )
        fetched = await self._blocks.warm(ref) or filling
        self.progress.bytes_done += ref.length
        if fetched:
            self.progress.bytes_fetched += ref.length
        self._metrics.warm_bytes.labels("fetched" if fetched else "cached").inc(ref.length)

    async def _advance(self, index: int, outcome: tuple[int, int]) -> None:
        """Move the cursor over finished objects; checkpoint now and then."""
        progress = self.progress
        self._finished[index] = outcome
        while progress.cursor in self._finished:
            objects, bytes_, errors_ = progress.at_cursor
            done, failed = self._finished.pop(progress.cursor)
            progress.at_cursor = (objects + 1, bytes_ + done, errors_ + failed)
            progress.cursor += 1
        if time.monotonic() - self._saved >= _CHECKPOINT_EVERY:
            await self.save()


async def _released(slots: asyncio.Semaphore, work: Awaitable[None]) -> None:
    try:
        await work
    finally:
        slots.release()


async def list_prefix(reader: Reader, bucket: str, prefix: str) -> list[tuple[str, int]]:
    """Every (key, size) under ``prefix``, through the metadata cache's listings."""
    items: list[tuple[str, int]] = []
    after = ""
    while True:
        page = await reader.list_objects(bucket, prefix, "", after, _LIST_PAGE)
        items += [(entry.key, entry.size) for entry in page.entries]
        if not page.is_truncated or not page.next_marker:
            return items
        after = page.next_marker


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first leaf of a (possibly nested) exception group."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
