"""Signed JSON calls to Hoard's admin endpoints.

Admin endpoints take the same SigV4 signatures as S3 requests (service
``s3``, with ``x-amz-content-sha256``), so the client signs with botocore's
``S3SigV4Auth`` and the credentials a user already has: explicit keys, or
the standard AWS chain (environment, profile, instance role) that boto3 uses.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import botocore.session
import urllib3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


class AdminError(Exception):
    """An admin call answered with an error status; ``body`` is its JSON (if any)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(
            f"HTTP {status}: {body.get('error', '')} {body.get('message', '')}".strip()
        )
        self.status = status
        self.body = body


@dataclass
class AdminClient:
    """``endpoint`` is Hoard's base URL (``http://host:9000``)."""

    endpoint: str
    access_key: str | None = None
    secret_key: str | None = None
    # The region Hoard serves (its ``region`` setting), as the SDKs find theirs.
    region: str = field(default_factory=lambda: os.environ.get("AWS_REGION")
                        or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")  # fmt: skip
    timeout: float = 30.0
    ca_bundle: Path | None = None  # a private CA's certificates (None: the system's)

    def __post_init__(self) -> None:
        self.endpoint = self.endpoint.rstrip("/")
        trust = {"ca_certs": str(self.ca_bundle)} if self.ca_bundle else {}
        self._pool = urllib3.PoolManager(timeout=self.timeout, retries=False, **trust)
        self._credentials = self._resolve_credentials()

    def _resolve_credentials(self) -> Credentials | None:
        if self.access_key and self.secret_key:
            return Credentials(self.access_key, self.secret_key)
        found = botocore.session.get_session().get_credentials()
        return found.get_frozen_credentials() if found is not None else None  # type: ignore[return-value]

    def call(
        self,
        method: str,
        path: str,
        query: dict[str, str] | None = None,
        body: Any = None,
    ) -> dict[str, Any]:
        """``method`` ``path`` (``/_hoard/...``) with an optional JSON body; the JSON answer."""
        url = self.endpoint + path + (f"?{urlencode(query)}" if query else "")
        data = b"" if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        request = AWSRequest(method=method, url=url, data=data, headers=headers)
        if self._credentials is not None:
            S3SigV4Auth(self._credentials, "s3", self.region).add_auth(request)
        answer = self._pool.request(method, url, body=data or None, headers=dict(request.headers))
        try:
            parsed = json.loads(answer.data) if answer.data else {}
        except ValueError:
            parsed = {
                "error": "InvalidResponse",
                "message": answer.data[:200].decode(errors="replace"),
            }
        if answer.status >= 400:
            raise AdminError(answer.status, parsed)
        return parsed
