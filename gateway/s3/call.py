"""What an S3 operation handler receives: the request, its route and caller."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.read.reader import Reader
from gateway.s3.auth import Principal
from gateway.s3.body import BodySender
from gateway.s3.chunked import IdleLimited
from gateway.s3.routing import Route
from gateway.write.writer import Writer


# Not frozen: built for every request, and a frozen field costs an object.__setattr__ each
# (a sixth of the admission of a hit); nothing changes a Call once built.
@dataclass(slots=True)
class Call:
    request: web.Request
    route: Route
    query: dict[str, str]
    principal: Principal
    reader: Reader
    request_id: str
    body: BodySender
    writer: Writer
    body_idle: float  # seconds a request body may send nothing (settings.body_timeout)

    def body_source(self) -> IdleLimited:
        """The request's body as it arrives, cut off with RequestTimeout when it stalls."""
        return IdleLimited(self.request.content, self.body_idle)

    @property
    def bucket(self) -> str:
        return self.route.bucket

    @property
    def key(self) -> str:
        assert self.route.key is not None, "object operations always carry a key"
        return self.route.key

    @property
    def may_warm(self) -> bool:
        """Whether the caller may warm this bucket, as the admin warm API decides it
        (``access.denied``, mutating): its reads and listings may then start auto-warm."""
        return self.principal.allows(self.bucket, mutating=True)
