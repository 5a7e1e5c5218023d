"""Warm jobs on one node: the jobs it accepted, and its shares of jobs (its own or a peer's).

A *job* is accepted by one node (``submit``). It runs as *shares*, one per
live node at that moment: this node's share runs here, the others are asked
to run theirs (``fanout.ShareClient``). A GET of the job sums the shares'
progress; a DELETE cancels every share. A single node is a job with one share.

Restart: a share whose file says queued or running when the process starts
is resumed from its cursor (``share.py``); one that cannot be (its file or key
list is unreadable) is marked failed with the reason. A share interrupted by
a shutdown stays "running" on disk, so the next start resumes it. A job's
other shares run on their own nodes and keep going while this one restarts.

Shares run at background priority (``gateway.priority``), at most
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
import secrets
import time
from typing import Any

from gateway import priority
from gateway.config import WarmConfig
from gateway.metrics import Metrics
from gateway.reader import Reader
from gateway.warm.fanout import ShareClient
from gateway.warm.share import ShareRun, list_prefix
from gateway.warm.spec import FINISHED, STATES, Progress, WarmSpec
from gateway.warm.store import JobStore

log = logging.getLogger(__name__)


class PinRefused(Exception):
    """A pinning job that cannot fit the pin quota; refused before it starts."""


class WarmJobs:
    def __init__(self, reader: Reader, store: JobStore, metrics: Metrics, config: WarmConfig,
                 pin_quota: int, peers: ShareClient | None = None) -> None:  # fmt: skip
        self._reader = reader
        self._store = store
        self._metrics = metrics
        self._config = config
        self.pin_quota = pin_quota
        self._peers = peers
        self._shares: dict[str, ShareRun] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._jobs: dict[str, dict[str, Any]] = {}  # accepted here: spec, nodes, cancelled
        self._last: dict[tuple[str, str], dict[str, Any]] = {}  # (job, node): last answer
        self._slots = asyncio.Semaphore(config.max_running)
        self._claims: dict[str, int] = {}  # job id: the locked descriptor of a running share

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Load the jobs and shares on disk; resume the shares that were not finished."""
        await self._store.start()
        for job_id, body in (await self._store.load_all("job")).items():
            if body is not None:
                self._jobs[job_id] = body
        for job_id, body in (await self._store.load_all("share")).items():
            self._restore(job_id, body)

    def _restore(self, job_id: str, body: dict[str, Any] | None) -> None:
        try:
            assert body is not None
            spec = WarmSpec.from_json(body["spec"])
            progress = Progress.from_json(body["progress"])
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            log.error("warm job %s cannot resume: its file is damaged (%r)", job_id, exc)
            progress = Progress()
            progress.finish("failed", f"cannot resume after a restart: job file damaged ({exc})")
            spec = WarmSpec(bucket="?", prefix="")
            self._shares[job_id] = self._run(job_id, spec, progress)
            self._spawn(self._shares[job_id].save())
            return
        if progress.state not in FINISHED and not self._claim(job_id):
            return  # another worker process of this node runs it
        self._shares[job_id] = run = self._run(job_id, spec, progress)
        if progress.state not in FINISHED:
            log.info("warm job %s: resuming at object %d", job_id, progress.cursor)
            progress.resume()
            progress.state = "queued"
            self._launch(run)

    async def close(self) -> None:
        """Stop running shares without cancelling them: they resume on the next start."""
        for run in self._shares.values():
            run.interrupted = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- this node's shares ------------------------------------------------------------

    def _run(self, job_id: str, spec: WarmSpec, progress: Progress) -> ShareRun:
        return ShareRun(job_id, spec, progress, self._reader, self._store, self._metrics,
                        self._config.concurrency, self.pin_quota)  # fmt: skip

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
            finally:
                self._release(run.job_id)

        with priority.background():  # the task copies this context: its origin calls wait
            task = asyncio.create_task(queued())
        self._tasks[run.job_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(run.job_id, None))

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks[f"save-{id(task)}"] = task
        task.add_done_callback(lambda _: self._tasks.pop(f"save-{id(task)}", None))

    async def add_share(self, job_id: str, spec: WarmSpec, created: float) -> dict[str, Any]:
        """Start this node's share of ``job_id`` (idempotent: a known share is left alone)."""
        if job_id not in self._shares and self._claim(job_id):
            run = self._run(job_id, spec, Progress(created=created))
            self._shares[job_id] = run
            await run.save()
            self._launch(run)
            await self._trim()
        return await self.share_status(job_id) or {}

    async def share_status(self, job_id: str) -> dict[str, Any] | None:
        run = self._shares.get(job_id)
        return None if run is None else await run.save_shown()

    async def cancel_share(self, job_id: str, unpin: bool) -> dict[str, Any] | None:
        run = self._shares.get(job_id)
        if run is None:
            return None
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if run.progress.state not in FINISHED:  # cancelled while queued
            run.progress.finish("cancelled", "cancelled")
            await run.save()
        if unpin and self._reader.blocks.disk is not None:
            await self._reader.blocks.disk.unpin(job_id)
        return run.progress.to_json()

    # -- jobs accepted here --------------------------------------------------------------

    async def submit(self, spec: WarmSpec) -> str:
        """Accept a job: check the bucket and the pin quota, start the shares.

        Raises ``NoSuchBucket`` and ``PinRefused`` before anything is started.
        """
        await self._reader.head_bucket(spec.bucket)
        nodes = self._peers.others() if self._peers is not None else []
        if spec.pin:
            await self._check_pin(spec, 1 + len(nodes))
        job_id = secrets.token_hex(8)
        created = time.time()
        record = {"spec": spec.to_json(), "nodes": nodes, "cancelled": False, "created": created}
        self._jobs[job_id] = record
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

    async def _check_pin(self, spec: WarmSpec, nodes: int) -> None:
        disk = self._reader.blocks.disk
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
        record = self._jobs.get(job_id)
        if record is None:
            return None
        record["cancelled"] = record["cancelled"] or not self._finished(job_id)
        record["unpinned"] = record.get("unpinned", False) or unpin
        await self._store.save(job_id, "job", record)
        await self.cancel_share(job_id, unpin)
        if self._peers is not None:
            peers = self._peers
            await asyncio.gather(*(peers.cancel(url, job_id, unpin) for url in record["nodes"]))
        return await self.status(job_id)

    def _finished(self, job_id: str) -> bool:
        local = self._shares.get(job_id)
        return (
            local is not None
            and local.progress.state in FINISHED
            and all(
                self._last.get((job_id, url), {}).get("state") in FINISHED
                for url in self._jobs[job_id]["nodes"]
            )
        )

    def bucket_of(self, job_id: str) -> str | None:
        """The bucket a job accepted here warms (None: no such job), for authorization."""
        record = self._jobs.get(job_id)
        return None if record is None else str(record["spec"]["bucket"])

    async def status(self, job_id: str) -> dict[str, Any] | None:
        """The job as its shares report it, summed (a node that does not answer: its last)."""
        record = self._jobs.get(job_id)
        if record is None:
            return None
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
        return [s for s in await asyncio.gather(*map(self.status, list(self._jobs))) if s]

    async def _trim(self) -> None:
        """Forget the oldest finished jobs beyond ``warm.history``."""
        done = [i for i, run in self._shares.items() if run.progress.state in FINISHED]
        done.sort(key=lambda i: self._shares[i].progress.created)
        for job_id in done[: max(0, len(done) - self._config.history)]:
            self._shares.pop(job_id, None)
            self._jobs.pop(job_id, None)
            await self._store.remove(job_id)

    def counts(self) -> dict[str, int]:
        """This node's shares by state (for the jobs gauge)."""
        counts = dict.fromkeys(STATES, 0)
        for run in self._shares.values():
            counts[run.progress.state] += 1
        return counts


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
