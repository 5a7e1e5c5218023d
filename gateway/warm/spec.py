"""What a warm job is asked to do (``WarmSpec``) and how far one node's share of it got.

Both travel as JSON: in ``POST /_hoard/warm``, between nodes, and in the job
files that let a job survive a restart, so each has ``from_json``/``to_json``
and nothing else.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from gateway.config.units import parse_duration
from gateway.obs.metrics import WARM_STATES as STATES

__all__ = ["FINISHED", "STATES", "Progress", "WarmSpec"]
FINISHED = ("done", "failed", "cancelled")
MAX_KEYS = 1_000_000  # keys given inline in one request
SAMPLES = 5  # error messages kept per share


@dataclass(frozen=True, slots=True)
class WarmSpec:
    """One bucket and exactly one of: a prefix, a list of keys, a manifest key."""

    bucket: str
    prefix: str | None = None
    keys: tuple[str, ...] | None = None
    manifest: str | None = None
    pin: bool = False
    pin_ttl: float = math.inf  # seconds a pin lasts from the job's start

    @classmethod
    def from_json(cls, body: Any) -> WarmSpec:
        """Validate a request body; ``ValueError`` with a message for the caller."""
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        unknown = set(body) - {"bucket", "prefix", "keys", "manifest", "pin", "pin_ttl"}
        if unknown:
            raise ValueError(f"unknown fields: {sorted(unknown)}")
        bucket = body.get("bucket")
        if not isinstance(bucket, str) or not bucket:
            raise ValueError("bucket is required")
        sources = [name for name in ("prefix", "keys", "manifest") if body.get(name) is not None]
        if len(sources) != 1:
            raise ValueError("give exactly one of prefix, keys, manifest")
        keys = body.get("keys")
        if keys is not None and (
            not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys)
        ):
            raise ValueError("keys must be a list of non-empty strings")
        if keys is not None and len(keys) > MAX_KEYS:
            raise ValueError(f"at most {MAX_KEYS} keys per request: use a manifest")
        for name in ("prefix", "manifest"):
            if body.get(name) is not None and not isinstance(body[name], str):
                raise ValueError(f"{name} must be a string")
        if body.get("manifest") == "":  # a prefix may be empty (the whole bucket); a key not
            raise ValueError("manifest must be an object key")
        if not isinstance(body.get("pin", False), bool):
            raise ValueError("pin must be true or false")
        ttl = body.get("pin_ttl")
        return cls(
            bucket=bucket,
            prefix=body.get("prefix"),
            keys=tuple(keys) if keys is not None else None,
            manifest=body.get("manifest"),
            pin=body.get("pin", False),
            pin_ttl=math.inf if ttl is None else parse_duration(ttl),
        )

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"bucket": self.bucket, "pin": self.pin}
        if self.prefix is not None:
            body["prefix"] = self.prefix
        if self.keys is not None:
            body["keys"] = list(self.keys)
        if self.manifest is not None:
            body["manifest"] = self.manifest
        if math.isfinite(self.pin_ttl):
            body["pin_ttl"] = self.pin_ttl
        return body


@dataclass(slots=True)
class Progress:
    """One node's share of a job. Counters only grow; totals are set once enumerated.

    ``cursor``: every object before this index (in enumeration order) is done,
    with ``at_cursor`` = (objects, bytes, errors) among them: where a restart
    resumes, counting again from there. ``floor`` keeps what was shown before
    the restart, so what is shown never goes back.
    """

    state: str = "queued"
    objects_total: int | None = None
    bytes_total: int | None = None  # of the whole job's objects, not only this share's
    objects_done: int = 0
    bytes_done: int = 0  # of the blocks this node owns
    bytes_fetched: int = 0  # of those, fetched from the origin (not already cached)
    errors: int = 0
    samples: list[str] = field(default_factory=list)
    reason: str = ""
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    cursor: int = 0
    at_cursor: tuple[int, int, int] = (0, 0, 0)
    floor: tuple[int, int] = (0, 0)  # (objects_done, bytes_done) shown before a restart
    resumed_at: tuple[float, int] | None = None  # (time, bytes_done) when this process began

    def error(self, message: str) -> None:
        self.errors += 1
        if len(self.samples) < SAMPLES:
            self.samples.append(message)

    def finish(self, state: str, reason: str = "") -> None:
        self.state, self.reason, self.finished = state, reason, time.time()

    def rate(self, now: float | None = None) -> float:
        """Bytes per second since this process began working on the share."""
        if self.resumed_at is None:
            return 0.0
        began, bytes_then = self.resumed_at
        end = self.finished if self.finished is not None else (now or time.time())
        return (self.bytes_done - bytes_then) / max(end - began, 1e-3)

    def resume(self) -> None:
        """Count again from the cursor (a restart): what lies past it is walked again."""
        shown = self.shown()
        self.floor = (shown["objects_done"], shown["bytes_done"])
        self.objects_done, self.bytes_done, self.errors = self.at_cursor
        self.samples = self.samples[: self.errors]

    def shown(self) -> dict[str, int]:
        return {"objects_done": max(self.objects_done, self.floor[0]),
                "bytes_done": max(self.bytes_done, self.floor[1])}  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body.update(self.shown(), rate=self.rate())
        return body

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Progress:
        known = {k: v for k, v in body.items() if k in cls.__slots__}  # type: ignore[attr-defined]
        progress = cls(**known)
        progress.at_cursor = tuple(progress.at_cursor)  # type: ignore[assignment]
        progress.floor = tuple(progress.floor)  # type: ignore[assignment]
        progress.resumed_at = None
        return progress
