"""Warm jobs on one node: the jobs it accepted, and its shares of jobs (its own or a peer's).

A *job* is accepted by one node (``submit``). It runs as *shares*, one per
live node at that moment: this node's share runs here, the others are asked
to run theirs (``fanout.ShareClient``). A GET of the job sums the shares'
progress; a DELETE cancels every share. A single node is a job with one share.

The workers of a node share the job store (``store.py``): every answer is read
from it, except the live progress of a share the answering worker runs itself.
Restart, or a worker's death: a share whose file says queued or running and
whose claim nobody holds is resumed from its cursor (``share.py``) by the first
worker to take the claim (at start, then every ``ADOPT_EVERY`` watch rounds);
one that cannot be (its file or key list is unreadable) is marked failed with
the reason. A share interrupted by a shutdown stays "running" on disk, so the
next start resumes it. A job's other shares run on their own nodes and keep
going while this one restarts.

Shares run at background priority (``gateway.core.priority``), at most
``warm.max_running`` at once per node; the others wait, queued.

Not guaranteed: that a block is fetched once when the nodes' views of the live
set differ during the job (each node warms what it believes it owns); that a
node joining during the job warms anything (it has no share); a share on a
node that stays unreachable keeps the job running and is shown as such.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from gateway.config.settings import WarmConfig
from gateway.core import priority
from gateway.core.tasks import TaskSet
from gateway.obs.metrics import Metrics
from gateway.read.reader import Reader
from gateway.warm.fanout import ShareClient
from gateway.warm.share import ShareRun, WarmTiers, list_prefix
from gateway.warm.spec import FINISHED, STATES, Progress, WarmSpec
from gateway.warm.store import JobStore, new_id

log = logging.getLogger(__name__)


class PinRefused(Exception):
    """A pinning job that cannot fit the pin quota; refused before it starts."""


WATCH = 0.2  # seconds between looks for cancellations asked through a sibling worker
ADOPT_EVERY = 5  # watch rounds between looks for shares no worker runs (one died)
CANCEL_WAIT = 10.0  # seconds a cancel waits for the sibling running the share to stop it


class WarmJobs:
    def __init__(self, reader: Reader, tiers: WarmTiers, store: JobStore, metrics: Metrics,
                 config: WarmConfig, pin_quota: int, peers: ShareClient | None = None) -> None:  # fmt: skip
        self._reader = reader
        self._tiers = tiers
        self._store = store
        self._metrics = metrics
        self._config = config
        self.pin_quota = pin_quota
        self._peers = peers
        self._runs: dict[str, ShareRun] = {}  # the shares this worker runs (it holds the claim)
        self._tasks = TaskSet()  # shares (named by job id) and their last saves
        self._last: dict[tuple[str, str], dict[str, Any]] = {}  # (job, node): last answer
        self._slots = asyncio.Semaphore(config.max_running)
        self._claims: dict[str, int] = {}  # job id: the locked descriptor of a running share
        self._counts = dict.fromkeys(STATES, 0)  # the node's shares by state, at the last look
        self._watcher: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Resume the shares no worker runs; then keep watching for cancels and orphans."""
        await self._store.start()
        await self._adopt()
        self._watcher = asyncio.create_task(self._watch())

    async def close(self) -> None:
        """Stop running shares without cancelling them: they resume on the next start."""
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        for run in self._runs.values():
            run.interrupted = True
        await self._tasks.cancel()

    async def _watch(self) -> None:
        rounds = 0
        while True:
            await asyncio.sleep(WATCH)
            rounds += 1
            try:
                for job_id in [j for j in self._runs if self._store.cancel_asked(j)]:
                    await self._stop(job_id)
                if rounds % ADOPT_EVERY == 0:
                    await self._adopt()
            except Exception:  # the watch must outlive one bad round (a full disk, say)
                log.exception("warm jobs: watching the node's shares failed")

    async def _adopt(self) -> None:
        """Run every unfinished share that no worker runs: after a restart, or after the
        worker running it died (the kernel dropped its claim). Also counts the node's
        shares by state, for the jobs gauge."""
        counts = dict.fromkeys(STATES, 0)
        for job_id, body in (await self._store.load_all("share")).items():
            state = _state(body)
            counts[state if state in counts else "failed"] += 1
            if job_id in self._runs or state in FINISHED or not self._claim(job_id):
                continue
            # Read again under the claim: its last holder may have finished it meanwhile.
            if self._store.exists(job_id, "share"):
                self._restore(job_id, await self._store.load(job_id, "share"))
            else:
                self._release(job_id)
        self._counts = counts

    def _restore(self, job_id: str, body: dict[str, Any] | None) -> None:
        """Resume a share whose claim this worker just took (or mark it failed)."""
        try:
            assert body is not None
            spec = WarmSpec.from_json(body["spec"])
            progress = Progress.from_json(body["progress"])
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            log.error("warm job %s cannot resume: its file is damaged (%r)", job_id, exc)
            progress = Progress()
            progress.finish("failed", f"cannot resume after a restart: job file damaged ({exc})")
            run = self._run(job_id, WarmSpec(bucket="?", prefix=""), progress)
            self._tasks.spawn(self._saved_then_released(run))
            return
        if progress.state in FINISHED:
            self._release(job_id)
            return
        self._runs[job_id] = run = self._run(job_id, spec, progress)
        log.info("warm job %s: resuming at object %d", job_id, progress.cursor)
        progress.resume()
        progress.state = "queued"
        self._launch(run)

    async def _saved_then_released(self, run: ShareRun) -> None:
        try:
            await run.save()
        finally:
            self._release(run.job_id)

    # -- this node's shares ------------------------------------------------------------

    def _run(self, job_id: str, spec: WarmSpec, progress: Progress) -> ShareRun:
        return ShareRun(job_id, spec, progress, self._reader, self._tiers, self._store,
                        self._metrics, self._config.concurrency, self.pin_quota)  # fmt: skip

    def _claim(self, job_id: str) -> bool:
        fd = self._store.claim(job_id)
        if fd is not None:
            self._claims[job_id] = fd
        return fd is not None

    def _release(self, job_id: str) -> None:
        fd = self._claims.pop(job_id, None)
        if fd is not None:
            os.close(fd)

    def _launch(self, run: ShareRun) -> None:
        async def queued() -> None:
            try:
                async with self._slots:
                    await run.run()
            finally:  # the share's last state is saved: siblings read it from now on
                self._runs.pop(run.job_id, None)
                self._release(run.job_id)

        with priority.background():  # the task copies this context: its origin calls wait
            self._tasks.spawn(queued(), name=run.job_id)

    async def add_share(self, job_id: str, spec: WarmSpec, created: float) -> dict[str, Any]:
        """Start this node's share of ``job_id`` (idempotent: a known share is left alone,
        whichever worker of the node runs it)."""
        if job_id not in self._runs and self._claim(job_id):
            if self._store.exists(job_id, "share"):
                self._release(job_id)  # known: finished, or an orphan the watch adopts
            else:
                run = self._run(job_id, spec, Progress(created=created))
                self._runs[job_id] = run
                await run.save()
                self._launch(run)
                await self._trim()
        return await self.share_status(job_id) or {}

    async def share_status(self, job_id: str) -> dict[str, Any] | None:
        """This node's share: live from the worker running it, else its last checkpoint."""
        run = self._runs.get(job_id)
        if run is not None:
            return await run.save_shown()
        body = await self._store.load(job_id, "share")
        return None if body is None else body.get("progress")

    async def cancel_share(self, job_id: str, unpin: bool) -> dict[str, Any] | None:
        """Cancel this node's share, whichever worker runs it (or none does)."""
        if job_id in self._runs:
            shown: dict[str, Any] | None = await self._stop(job_id)
        elif self._claim(job_id):  # no worker runs it: finished, or not resumed yet
            try:
                shown = await self._cancel_stored(job_id)
            finally:
                self._release(job_id)
        else:
            await self._store.ask_cancel(job_id)
            shown = await self._stopped_by_sibling(job_id)
        if shown is not None and unpin and self._tiers.disk is not None:
            await self._tiers.disk.unpin(job_id)
        return shown

    async def _stop(self, job_id: str) -> dict[str, Any]:
        """Cancel a share this worker runs: its fills in flight finish, nothing new starts."""
        run = self._runs[job_id]
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if run.progress.state not in FINISHED:  # cancelled while queued
            run.progress.finish("cancelled", "cancelled")
            await run.save()
        return run.progress.to_json()

    async def _cancel_stored(self, job_id: str) -> dict[str, Any] | None:
        body = await self._store.load(job_id, "share")
        if body is None:
            return None
        progress = Progress.from_json(body["progress"])
        if progress.state not in FINISHED:
            progress.finish("cancelled", "cancelled")
            await self._store.save(job_id, "share", {**body, "progress": progress.to_json()})
        return progress.to_json()

    async def _stopped_by_sibling(self, job_id: str) -> dict[str, Any] | None:
        """The share's state once the sibling running it has stopped it (or the wait ends)."""
        deadline = time.monotonic() + CANCEL_WAIT
        while True:
            shown = await self.share_status(job_id)
            if shown is None or shown.get("state") in FINISHED or time.monotonic() > deadline:
                return shown
            await asyncio.sleep(WATCH / 4)

    # -- jobs accepted by this node ------------------------------------------------------

    async def submit(self, spec: WarmSpec, bucket_known: bool = False) -> str:
        """Accept a job: check the bucket (unless ``bucket_known``: a read of it just
        succeeded) and the pin quota, start the shares.

        Raises ``NoSuchBucket`` and ``PinRefused`` before anything is started.
        """
        if not bucket_known:
            await self._reader.head_bucket(spec.bucket)
        nodes = self._peers.others() if self._peers is not None else []
        if spec.pin:
            await self._check_pin(spec, 1 + len(nodes))
        job_id = new_id()
        created = time.time()
        record = {"spec": spec.to_json(), "nodes": nodes, "cancelled": False, "created": created}
        await self._store.save(job_id, "job", record)
        await self.add_share(job_id, spec, created)
        if self._peers is not None:
            peers = self._peers
            started = await asyncio.gather(
                *(peers.start(url, job_id, spec.to_json(), created) for url in nodes)
            )
            for url, ok in zip(nodes, started, strict=True):
                if not ok:
                    self._last[(job_id, url)] = _unstarted(url)
        return job_id

    async def warming(self, spec: WarmSpec) -> bool:
        """Whether this node has an unfinished share of a job asking what ``spec`` asks
        (whichever worker or node accepted the job)."""
        asked = spec.to_json()
        shares = await self._store.load_all("share")
        return any(body is not None and body.get("spec") == asked and _state(body) not in FINISHED
                   for body in shares.values())  # fmt: skip

    async def _check_pin(self, spec: WarmSpec, nodes: int) -> None:
        disk = self._tiers.disk
        if disk is None:
            raise PinRefused("pinning needs the disk tier")
        free = self.pin_quota - disk.stats().pinned_bytes
        if free <= 0:
            raise PinRefused(f"pin quota exhausted: cache.pin_quota is {self.pin_quota} bytes "
                             f"and all of it is pinned")  # fmt: skip
        if spec.prefix is None:
            return  # sizes are known only once the job runs; the share fails at the quota
        total = sum(size for _, size in await list_prefix(self._reader, spec.bucket, spec.prefix))
        if total > free * nodes:
            raise PinRefused(
                f"pin quota exceeded: {total} bytes under the prefix, {free} bytes left of "
                f"cache.pin_quota ({self.pin_quota} bytes) on each of {nodes} node(s)"
            )

    async def cancel(self, job_id: str, unpin: bool) -> dict[str, Any] | None:
        record = await self._store.load(job_id, "job")
        if record is None:
            return None
        record["cancelled"] = record["cancelled"] or not await self._finished(job_id, record)
        record["unpinned"] = record.get("unpinned", False) or unpin
        await self._store.save(job_id, "job", record)
        await self.cancel_share(job_id, unpin)
        if self._peers is not None:
            peers = self._peers
            await asyncio.gather(*(peers.cancel(url, job_id, unpin) for url in record["nodes"]))
        return await self.status(job_id)

    async def _finished(self, job_id: str, record: dict[str, Any]) -> bool:
        local = await self.share_status(job_id)
        return (
            local is not None
            and local.get("state") in FINISHED
            and all(
                self._last.get((job_id, url), {}).get("state") in FINISHED
                for url in record["nodes"]
            )
        )

    async def bucket_of(self, job_id: str) -> str | None:
        """The bucket a job accepted by this node warms (None: no such job), for authorization."""
        record = await self._store.load(job_id, "job")
        return None if record is None else str(record["spec"]["bucket"])

    async def status(self, job_id: str) -> dict[str, Any] | None:
        """The job as its shares report it, summed (a node that does not answer: its last)."""
        record = await self._store.load(job_id, "job")
        return None if record is None else await self._status(job_id, record)

    async def _status(self, job_id: str, record: dict[str, Any]) -> dict[str, Any]:
        here = self._peers.self_url if self._peers else "local"
        shares = {here: await self.share_status(job_id)}
        if self._peers is not None and record["nodes"]:
            peers = self._peers
            answers = await asyncio.gather(*(peers.poll(url, job_id) for url in record["nodes"]))
            for url, answer in zip(record["nodes"], answers, strict=True):
                if answer is not None:
                    self._last[(job_id, url)] = {**answer, "reachable": True}
                last = self._last.get((job_id, url), _unreachable())
                shares[url] = {**last, "reachable": answer is not None}
        return summarize(job_id, record, shares)

    async def jobs(self) -> list[dict[str, Any]]:
        records = await self._store.load_all("job")
        found = [(i, r) for i, r in records.items() if r is not None]
        return list(await asyncio.gather(*(self._status(i, r) for i, r in found)))

    async def _trim(self) -> None:
        """Forget the node's oldest finished jobs beyond ``warm.history``."""
        shares = await self._store.load_all("share")
        done = [(_created(body), i) for i, body in shares.items() if _state(body) in FINISHED]
        done.sort()
        for _, job_id in done[: max(0, len(done) - self._config.history)]:
            await self._store.remove(job_id)

    def counts(self) -> dict[str, int]:
        """The node's shares by state (for the jobs gauge), as of the last look (~1 s)."""
        return dict(self._counts)


def _state(body: dict[str, Any] | None) -> str | None:
    progress = body.get("progress") if body else None
    return progress.get("state") if isinstance(progress, dict) else None


def _created(body: dict[str, Any] | None) -> float:
    progress = body.get("progress") if body else None
    return float(progress.get("created") or 0) if isinstance(progress, dict) else 0.0


def summarize(job_id: str, record: dict[str, Any], shares: dict[str, Any]) -> dict[str, Any]:
    """One job's view from its shares' progress (JSON of ``Progress``, by node)."""
    known = [s for s in shares.values() if s]
    states = {s.get("state") for s in known}
    local = next(iter(shares.values())) or {}
    bytes_total = local.get("bytes_total")
    bytes_done = sum(s.get("bytes_done", 0) for s in known)
    rate = sum(s.get("rate", 0.0) for s in known if s.get("state") == "running")
    if record.get("cancelled"):
        state = "cancelled"
    elif "failed" in states:
        state = "failed"
    elif states == {"done"} and len(known) == len(shares):
        state = "done"
    elif "running" in states or "done" in states:
        state = "running"
    else:
        state = "queued"
    left = (bytes_total or 0) - bytes_done
    eta = left / rate if rate > 0 and bytes_total is not None else None
    return {
        "id": job_id,
        "state": state,
        "spec": record["spec"],
        "objects_done": min((s.get("objects_done", 0) for s in known), default=0),
        "objects_total": local.get("objects_total"),
        "bytes_done": bytes_done,
        "bytes_total": bytes_total,
        "bytes_fetched": sum(s.get("bytes_fetched", 0) for s in known),
        "rate": rate,
        "eta": 0.0 if state == "done" else eta,
        "errors": sum(s.get("errors", 0) for s in known),
        "error_samples": [m for s in known for m in s.get("samples", [])][:5],
        "reason": next((s.get("reason") for s in known if s.get("state") == "failed"), "")
        or ("cancelled" if state == "cancelled" else ""),
        "pinned": bool(record["spec"].get("pin")) and not record.get("unpinned", False),
        "created": record.get("created"),
        "nodes": {url: _node_view(s) for url, s in shares.items()},
    }


def _node_view(share: dict[str, Any] | None) -> dict[str, Any]:
    if not share:
        return {"state": "unknown", "reachable": False}
    fields = ("state", "objects_done", "bytes_done", "bytes_fetched", "errors", "reason")
    return {**{k: share.get(k) for k in fields}, "reachable": share.get("reachable", True)}


def _unstarted(url: str) -> dict[str, Any]:
    return {**Progress(state="failed", reason=f"{url} could not be asked to run its share")
            .to_json(), "reachable": False}  # fmt: skip


def _unreachable() -> dict[str, Any]:
    return {"state": "running", "bytes_done": 0, "objects_done": 0, "rate": 0.0}
