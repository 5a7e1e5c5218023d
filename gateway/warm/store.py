"""Warm jobs on disk: small JSON files in ``<cache.dir>/warm/``, each replaced atomically.

Layout::

    warm/<id>.job.json     a job this node accepted: spec, the nodes sharing it, cancelled
    warm/<id>.share.json   this node's share of a job: spec, progress (spec.Progress)
    warm/<id>.keys         the share's enumerated objects, one JSON [key, size] a line
    warm/<id>.lock         flock'ed by the process running the share (``claim``)
    warm/<id>.cancel       a cancellation asked by a worker that does not run the share

The directory is the node's: every worker of a node reads it, so any of them
answers for every job (``jobs.py``). Only the worker holding a share's claim
writes its share file; a job file is written when the job is accepted and when
it is cancelled, by whichever worker is asked.

A file is written to ``<name>.tmp`` and renamed over the old one, so a crash
leaves the old version or the new one, never half of either. The key list is
written once, before any block is fetched, so a restart resumes over the same
objects in the same order even if the prefix changed meanwhile.

Not guaranteed: durability of the last checkpoint after a power cut (no
fsync: a lost checkpoint costs re-checking blocks that are already cached).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class JobStore:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    async def start(self) -> None:
        await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)

    def _path(self, job_id: str, kind: str) -> Path:
        if not valid_id(job_id):  # ids come from URLs: never a path of their own
            raise ValueError(f"not a warm job id: {job_id!r}")
        return self.directory / f"{job_id}.{kind}"

    def exists(self, job_id: str, kind: str) -> bool:
        return self._path(job_id, f"{kind}.json").exists()

    async def save(self, job_id: str, kind: str, body: dict[str, Any]) -> None:
        """Replace ``<id>.<kind>.json`` with ``body`` (``kind``: job or share)."""
        data = json.dumps(body, separators=(",", ":")).encode()
        await asyncio.to_thread(_replace, self._path(job_id, f"{kind}.json"), data)

    async def load(self, job_id: str, kind: str) -> dict[str, Any] | None:
        """``<id>.<kind>.json``, or None if there is none (or it cannot be read)."""
        return await asyncio.to_thread(self._load, self._path(job_id, f"{kind}.json"))

    def _load(self, path: Path) -> dict[str, Any] | None:
        try:
            body = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.error("warm job file %s is unreadable: %s", path, exc)
            return None
        return body if isinstance(body, dict) else None

    async def load_all(self, kind: str) -> dict[str, dict[str, Any] | None]:
        """Every ``<id>.<kind>.json``: its body, or None where the file cannot be read."""
        return await asyncio.to_thread(self._load_all, kind)

    def _load_all(self, kind: str) -> dict[str, dict[str, Any] | None]:
        found: dict[str, dict[str, Any] | None] = {}
        for path in sorted(self.directory.glob(f"*.{kind}.json")):
            job_id = path.name.removesuffix(f".{kind}.json")
            if not valid_id(job_id):
                continue
            try:
                found[job_id] = json.loads(path.read_bytes())
            except (OSError, ValueError) as exc:
                log.error("warm job file %s is unreadable: %s", path, exc)
                found[job_id] = None
        return found

    async def save_keys(self, job_id: str, items: Iterable[tuple[str, int]]) -> None:
        data = "".join(json.dumps([k, s]) + "\n" for k, s in items).encode()
        await asyncio.to_thread(_replace, self._path(job_id, "keys"), data)

    async def load_keys(self, job_id: str) -> list[tuple[str, int]] | None:
        """The saved key list, or None if there is none (or it is damaged)."""
        try:
            text = await asyncio.to_thread(self._path(job_id, "keys").read_text)
            return [(k, s) for k, s in map(json.loads, text.splitlines())]
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.error("warm job %s: key list unreadable: %s", job_id, exc)
            return None

    def claim(self, job_id: str) -> int | None:
        """Lock ``<id>.lock`` for this process (the descriptor), or None if another holds it.

        The worker processes of one node share the directory: only the one that
        holds the claim runs (or resumes) the share. The kernel drops the lock
        when its holder exits, however it exits.
        """
        fd = os.open(self._path(job_id, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    async def ask_cancel(self, job_id: str) -> None:
        """Ask the worker running the share to cancel it (it looks for this file often)."""
        await asyncio.to_thread(_replace, self._path(job_id, "cancel"), b"")

    def cancel_asked(self, job_id: str) -> bool:
        return self._path(job_id, "cancel").exists()

    async def remove(self, job_id: str) -> None:
        for kind in ("job.json", "share.json", "keys", "lock", "cancel"):
            await asyncio.to_thread(self._path(job_id, kind).unlink, missing_ok=True)


def valid_id(job_id: str) -> bool:
    """Whether ``job_id`` is one ``new_id`` could have made (16 lowercase hex digits)."""
    return len(job_id) == 16 and all(c in "0123456789abcdef" for c in job_id)


def new_id() -> str:
    return secrets.token_hex(8)


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
