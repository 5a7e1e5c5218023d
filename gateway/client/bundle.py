"""A batch GET client: many keys in one signed request, their bytes back in order.

``bundle(bucket, keys)`` sends ``POST /{bucket}?bundle`` (the dialect Tigris
defined, answered by Hoard: ``gateway/s3/bundle``) and yields ``(key, bytes)``
per key, in request order, as the TAR streams in: the first object is
usable while the last is still on its way. The TAR is read by
``client/tarstream.py`` (a member's bytes are one exact read, not
``tarfile``'s per-member objects and small reads). In fail mode it asks for
the archive's length (``X-Hoard-Bundle-Framing: length``): Hoard then sends
it unframed with a Content-Length, read with no chunk decoding, and a body
that ends short of it is an error here (``TarFormatError``, or
``http.client.IncompleteRead`` from its tail), as a missing last chunk is.

It needs no torch (the dataset in ``client/torch.py`` is built on it) and
nothing Tigris ships: credentials, region and endpoint come from the chain
``boto3.client("s3")`` uses (botocore's session: arguments, environment,
``~/.aws``, ``AWS_ENDPOINT_URL``; or, given whole, as they are), the request
is signed over the exact body bytes by the signer Hoard signs its origin
requests with (``origins/s3_sign.py``: botocore's SigV4, its day's key
derived once), and ``http.client`` carries it over the connections
``client/connections.py`` keeps, per process: a client made before a
``fork`` (a ``DataLoader``'s workers) is used by each child with connections
of its own, and its credentials, region and signer as the parent found them.

``on_error`` is ``fail`` by default here (a key missing is ``BundleError``
404 ``BundleKeyNotFound``, before any byte): a training sample that is not
there is a bug to hear about. With ``skip`` the missing keys are left out
of what is yielded and listed in ``BundleClient.skipped`` once the archive
is read.

Not guaranteed: a connection cut mid-archive raises ``TarFormatError`` (or
``http.client``'s ``IncompleteRead``) from the iterator, after the objects
before the cut were yielded; nothing is retried here.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import botocore.session
from botocore.credentials import Credentials

from gateway.client.connections import Connections
from gateway.client.tarstream import TarStream
from gateway.origins.s3_sign import Signer

ERRORS_ENTRY = "__bundle_errors.json"
_CODE = re.compile(r"<Code>(.*?)</Code>")


def aws_session(*, aws_access_key_id: str | None = None, aws_secret_access_key: str | None = None,
                aws_session_token: str | None = None, region_name: str | None = None,
                profile_name: str | None = None) -> botocore.session.Session:  # fmt: skip
    """botocore's session as ``boto3.Session(...)`` would make it (its credential chain;
    boto3 is not a dependency of Hoard, botocore is)."""
    session = botocore.session.Session(profile=profile_name)
    if aws_access_key_id is not None:
        session.set_credentials(aws_access_key_id, aws_secret_access_key, aws_session_token)
    if region_name is not None:
        session.set_config_variable("region", region_name)
    return session


def s3_client(endpoint: str | None = None, **credentials: Any) -> Any:
    """An S3 client as ``boto3.client("s3", endpoint_url=endpoint, **credentials)``."""
    return aws_session(**credentials).create_client("s3", endpoint_url=endpoint)


class BundleError(Exception):
    """The bundle was refused: its HTTP status, S3 error code and body."""

    def __init__(self, status: int, code: str | None, body: str) -> None:
        super().__init__(f"bundle refused (HTTP {status} {code}): {body}")
        self.status, self.code, self.body = status, code, body


class BundleClient:
    """Batch GETs against one endpoint, with one boto3 session's credentials and a pool."""

    def __init__(self, endpoint: str | None = None, *, pool_size: int = 4,
                 timeout: float = 60.0, **credentials: Any) -> None:  # fmt: skip
        """``credentials``: boto3.Session's arguments (``aws_access_key_id``,
        ``aws_secret_access_key``, ``aws_session_token``, ``region_name``, ``profile_name``)."""
        endpoint, region, self._credentials = _identity(endpoint, credentials)
        self.endpoint = endpoint.rstrip("/")
        self.region = region or "us-east-1"
        if self._credentials is None:
            raise ValueError("no AWS credentials found for the bundle client")
        parts = urlsplit(self.endpoint)
        self._host, self._path = parts.netloc, parts.path
        self._signer = Signer(self.region)  # the day's key derived once, not per request
        self._connections = Connections(parts, pool_size, timeout)
        self.skipped: list[dict[str, str]] = []

    def bundle(
        self, bucket: str, keys: list[str], on_error: str = "fail"
    ) -> Iterator[tuple[str, bytes]]:
        """``(key, bytes)`` of each present key of ``bucket``, in the order asked."""
        if not keys:
            return
        connection, answer = self._send(bucket, keys, on_error)
        self.skipped = []
        whole = False
        try:
            for name, body in TarStream(answer.read):
                if name == ERRORS_ENTRY:
                    self.skipped = json.loads(body)["skipped"]
                else:
                    yield name, body
            answer.read()  # the rest (END's second block): IncompleteRead if it is short
            whole = True
        finally:
            if whole:  # the archive read to its end: the connection goes back for reuse
                self._connections.give(connection)
            else:  # stopped early or cut: what is left of the answer is not read
                connection.close()

    def _send(self, bucket: str, keys: list[str], on_error: str
              ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:  # fmt: skip
        body = json.dumps({"keys": keys}).encode()
        headers = {"Content-Type": "application/json", "X-Tigris-Bundle-Format": "tar",
                   "X-Tigris-Bundle-Compression": "none", "X-Tigris-Bundle-On-Error": on_error,
                   "Host": self._host}  # fmt: skip
        if on_error == "fail":  # its length is known first: asked for, read unframed
            headers["X-Hoard-Bundle-Framing"] = "length"
        payload = hashlib.sha256(body).hexdigest()
        url = f"{self.endpoint}/{bucket}?bundle"  # a bucket's name needs no escaping
        credentials = self._credentials.get_frozen_credentials()  # a refreshed one, if it was
        signed = self._signer.sign(credentials, "POST", url, headers, payload)
        connection = self._connections.take()
        try:
            connection.request("POST", f"{self._path}/{bucket}?bundle", body=body, headers=signed)
            answer = connection.getresponse()
            if answer.status >= 400:
                text = answer.read().decode("utf-8", "replace")
                found = _CODE.search(text)
                raise BundleError(answer.status, found.group(1) if found else None, text)
        except BundleError:
            self._connections.give(connection)  # its answer was read whole
            raise
        except BaseException:
            connection.close()
            raise
        return connection, answer

    def close(self) -> None:
        self._connections.close()


def _identity(
    endpoint: str | None, credentials: dict[str, Any]
) -> tuple[str, str | None, Credentials | None]:
    """The endpoint, region and credentials a client signs with, as boto3 would find them.

    Given whole (an endpoint, a key, its secret and a region) they are taken as they
    are: botocore's session, which would hold them just so, costs 10-20 ms of CPU to
    make (its event handlers), once a dataset, in the process that makes it. Else the
    session's chain finds what is missing; a client is made only for an endpoint
    (a tenth of a second of CPU)."""
    whole = {"aws_access_key_id", "aws_secret_access_key", "region_name"}
    if (
        endpoint is not None
        and credentials.keys() - {"aws_session_token"} == whole
        and all(credentials[name] is not None for name in whole)
    ):
        token = credentials.get("aws_session_token")
        keys = Credentials(credentials["aws_access_key_id"], credentials["aws_secret_access_key"],
                           token)  # fmt: skip
        return endpoint, credentials["region_name"], keys
    session = aws_session(**credentials)
    if endpoint is None:  # the chain's endpoint: only a client made from it knows
        probe = session.create_client("s3")
        return probe.meta.endpoint_url, probe.meta.region_name, session.get_credentials()
    return endpoint, session.get_config_variable("region"), session.get_credentials()


def bundle(bucket: str, keys: list[str], endpoint: str | None = None, *, on_error: str = "fail",
           **credentials: Any) -> Iterator[tuple[str, bytes]]:  # fmt: skip
    """``(key, bytes)`` of ``keys`` in ``bucket``, in order, from one batch GET.

    A client (and its pool) per call; for many calls keep a ``BundleClient``.
    """
    client = BundleClient(endpoint, **credentials)
    try:
        yield from client.bundle(bucket, keys, on_error)
    finally:
        client.close()
