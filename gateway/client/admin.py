"""Signed JSON calls to Hoard's admin endpoints.

Admin endpoints take the same SigV4 signatures as S3 requests (service
``s3``, with ``x-amz-content-sha256``), so the client signs with botocore's
``S3SigV4Auth`` and the credentials a user already has: explicit keys, or
the standard AWS chain (environment, profile, instance role) that boto3 uses.
A call refused for its credentials (401, 403) says which ones it was signed
with, or that none were found and it went unsigned: "AccessDenied" alone
leaves a user guessing which of the chain's sources won.
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

# Where botocore's chain found the credentials (its ``method``), as a user would set them.
_SOURCES = {
    "env": "the environment (AWS_ACCESS_KEY_ID)",
    "shared-credentials-file": "~/.aws/credentials",
    "config-file": "~/.aws/config",
    "iam-role": "the instance's role",
    "container-role": "the container's role",
}
_FROM_PROFILE = ("shared-credentials-file", "config-file")


class AdminError(Exception):
    """An admin call answered with an error status; ``body`` is its JSON (if any).

    ``signer``: who the call was signed as (``AdminClient.signer``), named in
    the message when the credentials were refused.
    """

    def __init__(self, status: int, body: dict[str, Any], signer: str = "") -> None:
        text = f"HTTP {status}: {body.get('error', '')} {body.get('message', '')}".strip()
        if signer and status in (401, 403):
            text += f" ({signer})"
        super().__init__(text)
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
        self._source = "the arguments"
        if self.access_key and self.secret_key:
            return Credentials(self.access_key, self.secret_key)
        if self.access_key or self.secret_key:  # half a pair would silently sign as someone else
            raise ValueError("give both an access key and a secret key, or neither")
        session = botocore.session.get_session()
        found = session.get_credentials()
        if found is None:
            return None
        self._source = _SOURCES.get(found.method, found.method)
        if found.method in _FROM_PROFILE:
            self._source += f", profile {session.get_config_variable('profile') or 'default'!r}"
        return found.get_frozen_credentials()  # type: ignore[return-value]

    @property
    def signer(self) -> str:
        """Who calls are signed as, for messages: the access key (never the secret), its source."""
        if self._credentials is None:
            return "unsigned: no AWS credentials found"
        return f"signed with access key {self._credentials.access_key!r} from {self._source}"

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
            raise AdminError(answer.status, parsed, self.signer)
        return parsed
