"""Auto-warm: a cold epoch over a prefix a client listed warms the rest of that prefix.

Why. A data loader reads an epoch's objects in a shuffled order, one or a few
at a time. Cold, each read waits for the origin, and a cache in front can only
add to that wait, however little it adds (measured, one reader of 4 KiB objects
on loopback: ~1 ms on top of ~2). What a cache can do that such a reader does
not is fetch *ahead*, many at once. A reader that registers its order
(``POST /_hoard/prefetch``) says what comes next; one that does not still says
what the epoch holds, because data loaders list the dataset before they read it
(s3torchconnector's ``from_prefix``, DLIO's file list, s3fs's ``find``), then
read every object of it once an epoch.

The rule. A read whose first block came from the origin (``Reader.cold_reads``)
by a client that may warm the bucket, under a whole listing held in this worker's metadata memory
(``MetadataCache.listed``) is counted against that listing, and the narrowest
directory holding every cold key counted so far is kept. Once the count reaches
``warm.auto_after`` and 1 in ``_SAMPLE_OF`` of the objects listed under that
directory, the directory is warmed by a warm job (``jobs.py``): ``warm.concurrency``
blocks at a time, at background priority behind client misses, each block
fetched once (a client's miss of a block being warmed joins its fill). Not
when its listed bytes exceed ``warm.auto_max_share`` of the disk tier: a job
fetching in listing order would evict what it fetched before the reader, in its
own order, came to it. Each listing a worker holds decides once; a listing
learned again (past its TTL) starts a new count, so an epoch that finds the
prefix cold again (evicted, or changed at the origin) warms it again.

Why the narrowest directory: a listing of a bucket's root (``aws s3 ls``, which
Hoard walks whole) covers every dataset in it, but a shuffled epoch over one of
them reads keys of that one only; 16 random keys of ``imagenet/train/n*/`` have
``imagenet/train/`` in common, and that is what is warmed.

With ``workers: N`` the data loader's LIST and its GETs may reach different
workers (a reader on one keep-alive connection reads through one worker, its
LIST came on another). The worker serving a client's listing page records the
prefix for the node (``listed.py``); a worker reading cold under a recorded
prefix it holds no listing of lists it once itself, then counts as above.

Who. A job spends what an admin warm job spends (the disk tier, origin
bandwidth), so only callers that may warm the bucket count: the S3 front
tells the reader's observers whether the caller may (``Call.may_warm``, the
rule ``s3/access.py`` applies to ``POST /_hoard/warm``: a write). The cold
reads and listings of a ``readonly`` key, a key limited to other buckets, or
an anonymous caller are served as any other, and neither counted nor recorded.

One job per prefix per node: a worker that decides to warm looks for an
unfinished share of the same job on the node (``WarmJobs.warming``): a sibling
worker, or in a cluster another node (whose job gave this node a share), may
have decided first. Two workers deciding in the same instant can both start
one; their fills coalesce, so the origin still sees each block once.

Not guaranteed: that the reader reads what is warmed (a reader of a sample of
a listed prefix past the thresholds makes Hoard fetch the rest: turn this off
with ``warm.auto_after: 0`` where that costs too much); that the workers of a
node count together (each counts the cold reads it serves, so with reads
spread over N workers the first decides after about N times the count). A read
of a key outside every listing held or recorded is never counted.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

from gateway.config.settings import WarmConfig
from gateway.core import errors
from gateway.core.tasks import TaskSet
from gateway.metadata.lookups import directory_of
from gateway.metadata.memory import MetadataCache
from gateway.metadata.source import scope_of
from gateway.obs.metrics import Metrics
from gateway.origins.namespace import Mount
from gateway.warm.listed import Listed, ListedPrefixes
from gateway.warm.spec import WarmSpec

log = logging.getLogger(__name__)

_SAMPLE_OF = 1000  # cold reads must be at least 1 in this many objects listed
_LISTINGS = 256  # listings counted at once per worker (the least recently counted go)

_RELIST = 300.0  # seconds before a worker lists a recorded prefix again (it was evicted)

Warming = Callable[[WarmSpec], Awaitable[bool]]
Submit = Callable[[WarmSpec], Awaitable[str]]
ListPrefix = Callable[[str, str], Awaitable[object]]


@dataclass(slots=True)
class _Count:
    """The cold reads counted against one listing, as it was learned at ``learned``."""

    learned: float
    reads: int = 0
    common: str | None = None  # the narrowest directory holding every key counted
    decided: bool = False


class AutoWarm:
    """Counts cold reads against the listings that cover them; warms a prefix read cold."""

    def __init__(self, metadata: MetadataCache, config: WarmConfig, capacity: Callable[[], int],
                 warming: Warming, submit: Submit, metrics: Metrics,
                 listed: ListedPrefixes, list_prefix: ListPrefix) -> None:  # fmt: skip
        """``capacity()``: the disk tier's bytes now; ``warming(spec)``: whether the node
        runs an unfinished share of that job; ``submit(spec)`` starts one (its id);
        ``listed``: the prefixes the node's workers listed for clients;
        ``list_prefix(bucket, prefix)`` lists one through this worker's reader."""
        self._metadata = metadata
        self._listed = listed
        self._list_prefix = list_prefix
        # Recorded prefixes listed here (ordered: the oldest goes in O(1)).
        self._asked: OrderedDict[tuple[Hashable, str], float] = OrderedDict()
        self._after = config.auto_after
        self._share = config.auto_max_share
        self._capacity = capacity
        self._warming = warming
        self._submit = submit
        self._metrics = metrics
        self._counts: OrderedDict[tuple[Hashable, str], _Count] = OrderedDict()
        self._tasks = TaskSet()

    def listing(self, mount: Mount, prefix: str, may_warm: bool) -> None:
        """A client was served a listing page of ``prefix`` (origin terms): recorded for
        the node's other workers, if that client may warm the bucket."""
        if self._after > 0 and may_warm:
            self._listed.record(mount, prefix)

    def cold(self, mount: Mount, okey: str, may_warm: bool) -> None:
        """A read of ``okey`` (origin terms) had its first block from the origin;
        counted only if its client may warm the bucket."""
        if self._after <= 0 or not may_warm:
            return
        scope = scope_of(mount)
        listed = self._metadata.listed(scope, okey)
        if listed is None:
            self._learn(mount, okey)
            return
        snapshot, learned = listed
        k = (scope, snapshot.prefix)
        count = self._counts.get(k)
        if count is None or count.learned != learned:
            count = self._counts[k] = _Count(learned)
            while len(self._counts) > _LISTINGS:
                self._counts.popitem(last=False)
        self._counts.move_to_end(k)
        if count.decided:
            return
        count.reads += 1
        count.common = directory_of(okey) if count.common is None else _holding(count.common, okey)
        if count.reads < self._after:
            return
        rows = snapshot.under(count.common)
        if count.reads * _SAMPLE_OF < len(rows):
            return
        count.decided = True
        self._decide(mount, count.common, len(rows), snapshot.size_of(rows), count.reads)

    def _learn(self, mount: Mount, okey: str) -> None:
        """List here, once, a prefix a sibling worker listed for a client that covers ``okey``."""
        recorded = self._listed.covering(mount, okey)
        if recorded is None:
            return
        k = (scope_of(mount), recorded.prefix)
        now = time.monotonic()
        if now - self._asked.get(k, -_RELIST) < _RELIST:
            return
        self._asked[k] = now
        if len(self._asked) > _LISTINGS:
            self._asked.popitem(last=False)
        self._tasks.spawn(self._list(recorded))

    async def _list(self, recorded: Listed) -> None:
        try:
            await self._list_prefix(recorded.bucket, recorded.client_prefix)
        except (errors.HoardError, OSError) as exc:
            log.warning("auto-warm: listing %s/%s failed: %s", recorded.bucket,
                        recorded.client_prefix, exc)  # fmt: skip

    def _decide(self, mount: Mount, prefix: str, objects: int, size: int, reads: int) -> None:
        bound = int(self._share * self._capacity())
        if not prefix.startswith(mount.prefix):  # a mount's prefix that ends mid-name
            prefix = mount.prefix
        where = f"{mount.bucket}/{mount.client_key(prefix)}"
        if size > bound:
            self._metrics.warm_auto.labels("too_big").inc()
            log.info("auto-warm: %s read cold %d times; not warmed: its %d objects, %d bytes, "
                     "are over %d (warm.auto_max_share of the disk tier)",
                     where, reads, objects, size, bound)  # fmt: skip
            return
        spec = WarmSpec(bucket=mount.bucket, prefix=mount.client_key(prefix))
        self._tasks.spawn(self._start(spec, where, objects, size, reads))

    async def _start(self, spec: WarmSpec, where: str, objects: int, size: int, reads: int) -> None:
        try:
            if await self._warming(spec):
                self._metrics.warm_auto.labels("running").inc()
                return
            job_id = await self._submit(spec)
        except (errors.HoardError, OSError) as exc:
            log.warning("auto-warm: %s could not be warmed: %s", where, exc)
            return
        self._metrics.warm_auto.labels("started").inc()
        log.info("auto-warm: %s read cold %d times; warming its %d objects (%d bytes): job %s",
                 where, reads, objects, size, job_id)  # fmt: skip

    async def close(self) -> None:
        await self._tasks.cancel()

    async def settle(self) -> None:
        """Wait for the decisions under way (tests)."""
        await self._tasks.settle()


def _holding(directory: str, key: str) -> str:
    """The narrowest of ``directory`` and its ancestors that holds ``key``."""
    while not key.startswith(directory):
        directory = directory_of(directory[:-1])
    return directory
