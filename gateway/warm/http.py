"""The HTTP face of warm jobs: the admin routes and the peer routes.

Admin (a configured credential, checked by ``admin.py`` before these run, and
the key's ``buckets``/``readonly`` limits, checked here by ``gateway/access.py``'s
rule: submitting and cancelling are writes on the job's bucket, a job in a
bucket the key may not use is not found)::

    POST   /_hoard/warm              {"bucket", "prefix"|"keys"|"manifest", "pin", "pin_ttl"}
                                     → 202 {"id", ...status}
    GET    /_hoard/warm              → {"jobs": [status, ...]}
    GET    /_hoard/warm/{id}         → status
    DELETE /_hoard/warm/{id}         → cancel; with ?unpin=1 also release its pins

Peer (the cluster secret, checked by ``PeerServer``), one node's share::

    POST   /_hoard/peer/warm/{id}    {"spec", "created"} → its progress
    GET    /_hoard/peer/warm/{id}    → its progress
    DELETE /_hoard/peer/warm/{id}    → cancel (?unpin=1)

Errors are JSON ``{"error", "message"}``: 400 ``InvalidArgument``, 404
``NoSuchJob``/``NoSuchBucket``, 409 ``PinQuotaExceeded``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from aiohttp import web

from gateway.core import errors
from gateway.s3.access import denied, json_error
from gateway.s3.auth import Principal
from gateway.warm.jobs import PinRefused, WarmJobs
from gateway.warm.spec import WarmSpec
from gateway.warm.store import valid_id

log = logging.getLogger(__name__)

PATH = "/_hoard/warm"


def _no_job(job_id: str) -> web.Response:
    return json_error(404, "NoSuchJob", f"no warm job {job_id!r} on this node")


def _unpin(request: web.Request) -> bool:
    return request.query.get("unpin", "") in ("1", "true", "yes")


class WarmHttp:
    def __init__(self, jobs: WarmJobs) -> None:
        self._jobs = jobs

    async def admin(
        self, request: web.Request, path: str, principal: Principal
    ) -> web.StreamResponse:
        """A signed admin request under ``/_hoard/warm``, by ``principal``."""
        job_id = path.removeprefix(PATH).strip("/")
        method = request.method
        if not job_id and method == "POST":
            return await self._submit(request, principal)
        if not job_id and method == "GET":
            jobs = await self._jobs.jobs()
            return web.json_response(
                {"jobs": [job for job in jobs if principal.may_use(job["spec"]["bucket"])]}
            )
        if job_id and method in ("GET", "DELETE"):
            bucket = await self._jobs.bucket_of(job_id) if valid_id(job_id) else None
            if bucket is None or not principal.may_use(bucket):
                return _no_job(job_id)
            if method == "DELETE":
                refused = denied(principal, bucket, mutating=True)
                if refused is not None:
                    return refused
            status = await (
                self._jobs.cancel(job_id, _unpin(request))
                if method == "DELETE"
                else self._jobs.status(job_id)
            )
            return web.json_response(status) if status is not None else _no_job(job_id)
        return json_error(405, "MethodNotAllowed", f"{method} {path}")

    async def _submit(self, request: web.Request, principal: Principal) -> web.StreamResponse:
        body = await request.read()
        declared = request.headers.get("x-amz-content-sha256", "")
        if len(declared) == 64 and hashlib.sha256(body).hexdigest() != declared.lower():
            return json_error(400, "XAmzContentSHA256Mismatch", "the body does not match its hash")
        try:
            spec = WarmSpec.from_json(json.loads(body or b"null"))
        except ValueError as exc:
            return json_error(400, "InvalidArgument", str(exc))
        refused = denied(principal, spec.bucket, mutating=True)
        if refused is not None:
            return refused
        try:
            job_id = await self._jobs.submit(spec)
        except PinRefused as exc:
            return json_error(409, "PinQuotaExceeded", str(exc))
        except errors.NoSuchBucket:
            return json_error(404, "NoSuchBucket", f"no bucket {spec.bucket!r}")
        except errors.HoardError as exc:
            return json_error(503, "OriginUnavailable", f"{type(exc).__name__}: {exc}")
        status = await self._jobs.status(job_id) or {"id": job_id}
        return web.json_response(status, status=202)

    async def peer(self, request: web.Request, rest: str, body: bytes) -> web.StreamResponse:
        """A signed peer request under ``/_hoard/peer/warm/``: this node's share of a job."""
        job_id = rest.strip("/")
        if not valid_id(job_id):
            return json_error(404, "NoSuchJob", f"no warm job {job_id!r}")
        answer: dict[str, Any] | None
        if request.method == "POST":
            try:
                sent = json.loads(body)
                spec = WarmSpec.from_json(sent["spec"])
                created = float(sent["created"])
            except (ValueError, KeyError, TypeError) as exc:
                return json_error(400, "InvalidArgument", f"bad share request: {exc}")
            answer = await self._jobs.add_share(job_id, spec, created)
        elif request.method == "GET":
            answer = await self._jobs.share_status(job_id)
        elif request.method == "DELETE":
            answer = await self._jobs.cancel_share(job_id, _unpin(request))
        else:
            return json_error(405, "MethodNotAllowed", request.method)
        return web.json_response(answer) if answer is not None else _no_job(job_id)
