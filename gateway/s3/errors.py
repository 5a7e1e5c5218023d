"""The S3 error table, and the one translation from domain errors to S3 errors.

Each code carries its HTTP status and default message, as in the S3 API
reference ("Error responses"). ``S3Error`` is what the front raises;
``from_domain`` maps ``gateway.core.errors`` onto it so nothing below ``s3/``
needs to know S3's spelling.
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime
from enum import Enum, unique

from gateway.core import errors


@unique  # two codes with the same (status, message) would silently become one
class Code(Enum):
    """S3 error codes: (HTTP status, default message). The wire code is the name."""

    AccessDenied = (403, "Access Denied")
    AuthorizationHeaderMalformed = (400, "The authorization header is malformed.")
    AuthorizationQueryParametersError = (400, "Error parsing the X-Amz-Credential parameter.")
    BadRequest = (400, "Bad Request")
    BadDigest = (400, "The Content-MD5 you specified did not match what we received.")
    # Tigris' bundle dialect: fail mode, a key missing (its <MissingKeys> lists them).
    BundleKeyNotFound = (404, "One or more keys could not be resolved")
    BucketAlreadyExists = (409, "The requested bucket name is not available.")
    BucketNotEmpty = (409, "The bucket you tried to delete is not empty")
    CORSResponse = (403, "CORS is not enabled for this bucket.")
    EntityTooLarge = (400, "Your proposed upload exceeds the maximum allowed object size.")
    EntityTooSmall = (400, "Your proposed upload is smaller than the minimum allowed object size.")
    IncompleteBody = (
        400,
        "You did not provide the number of bytes specified by the Content-Length HTTP header.",
    )
    InternalError = (500, "We encountered an internal error. Please try again.")
    InvalidAccessKeyId = (403, "The AWS Access Key Id you provided does not exist in our records.")
    InvalidArgument = (400, "Invalid Argument")
    InvalidBucketName = (400, "The specified bucket is not valid.")
    InvalidDigest = (400, "The Content-MD5 you specified is not valid.")
    InvalidObjectName = (400, "Object name contains characters this origin cannot store.")
    InvalidPart = (
        400,
        "One or more of the specified parts could not be found. The part may not have been "
        "uploaded, or the specified entity tag may not match the part's entity tag.",
    )
    InvalidPartOrder = (
        400,
        "The list of parts was not in ascending order. Parts must be ordered by part number.",
    )
    InvalidRange = (416, "The requested range is not satisfiable")
    InvalidRequest = (400, "Invalid Request")
    KeyTooLongError = (400, "Your key is too long")
    MalformedXML = (
        400,
        "The XML you provided was not well-formed or did not validate against our published schema.",
    )
    MaxMessageLengthExceeded = (400, "Your request was too big.")
    MetadataTooLarge = (400, "Your metadata headers exceed the maximum allowed metadata size.")
    MethodNotAllowed = (405, "The specified method is not allowed against this resource.")
    MissingContentLength = (411, "You must provide the Content-Length HTTP header.")
    NoSuchBucket = (404, "The specified bucket does not exist")
    NoSuchKey = (404, "The specified key does not exist.")
    NoSuchUpload = (
        404,
        "The specified upload does not exist. The upload ID may be invalid, "
        "or the upload may have been aborted or completed.",
    )
    NoSuchVersion = (404, "The specified version does not exist.")
    NotImplemented = (501, "A header you provided implies functionality that is not implemented.")
    NotModified = (304, "Not Modified")
    PreconditionFailed = (412, "At least one of the pre-conditions you specified did not hold")
    RequestTimeout = (
        400,
        "Your socket connection to the server was not read from or written to within the "
        "timeout period. Idle connections will be closed.",
    )
    RequestTimeTooSkewed = (
        403,
        "The difference between the request time and the server's time is too large.",
    )
    ServiceUnavailable = (503, "Reduce your request rate.")
    SignatureDoesNotMatch = (
        403,
        "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
    )
    SlowDown = (503, "Please reduce your request rate.")
    XAmzContentSHA256Mismatch = (
        400,
        "The provided 'x-amz-content-sha256' header does not match what was computed.",
    )

    @property
    def status(self) -> int:
        return self.value[0]

    @property
    def default_message(self) -> str:
        return self.value[1]


class S3Error(Exception):
    """An error answered to the client as S3 XML (or a bare status for HEAD).

    ``fields`` are extra elements S3 adds for some codes (``BucketName``,
    ``Key``, ``Condition``, ``ActualObjectSize``...), rendered in order; a list
    of keys is one element of ``<Key>`` children (``MissingKeys``).
    ``headers`` go onto the response (a 304 keeps ETag and Last-Modified).
    """

    def __init__(
        self,
        code: Code,
        message: str | None = None,
        *,
        fields: dict[str, str | list[str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message or code.default_message)
        self.code = code
        self.message = message or code.default_message
        self.fields = fields or {}
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return self.code.status


def from_domain(exc: errors.HoardError) -> S3Error:
    """Translate a domain error into the S3 error a client expects."""
    match exc:
        case errors.NoSuchBucket():
            return S3Error(Code.NoSuchBucket, fields={"BucketName": exc.bucket})
        case errors.NoSuchKey():
            return S3Error(Code.NoSuchKey, fields={"Key": exc.key}, headers=exc.headers)
        case errors.InvalidBucketName():
            return S3Error(Code.InvalidBucketName, str(exc) or None)
        case errors.BucketAlreadyExists():
            return S3Error(Code.BucketAlreadyExists, str(exc) or None)
        case errors.BucketNotEmpty():
            return S3Error(Code.BucketNotEmpty, str(exc) or None)
        case errors.InvalidObjectName():
            return S3Error(Code.InvalidObjectName, str(exc) or None)
        case errors.AccessDenied():
            return S3Error(Code.AccessDenied, str(exc) or None)
        case errors.PreconditionFailed():
            return S3Error(Code.PreconditionFailed, fields={"Condition": exc.condition})
        case errors.NotModified():
            return S3Error(Code.NotModified, headers=_not_modified_headers(exc))
        case errors.RangeNotSatisfiable():
            return S3Error(
                Code.InvalidRange,
                fields={"RangeRequested": "", "ActualObjectSize": str(exc.size)},
                headers={"Content-Range": f"bytes */{exc.size}"},
            )
        case errors.OriginThrottled():
            return S3Error(Code.SlowDown, str(exc) or None)
        case errors.OriginUnavailable() | errors.OriginChanged():
            return S3Error(Code.ServiceUnavailable, str(exc) or "The origin is unavailable.")
        case errors.NoSuchUpload():
            return S3Error(Code.NoSuchUpload, fields={"UploadId": exc.upload_id})
        case errors.InvalidPart():
            return S3Error(Code.InvalidPart, str(exc) or None)
        case errors.InvalidPartOrder():
            return S3Error(Code.InvalidPartOrder)
        case errors.EntityTooSmall():
            return S3Error(Code.EntityTooSmall, str(exc) or None)
        case errors.InvalidArgument():
            return S3Error(Code.InvalidArgument, str(exc) or None)
        case errors.MetadataTooLarge():
            return S3Error(Code.MetadataTooLarge, str(exc) or None)
        case errors.NotImplementedByOrigin():
            return S3Error(Code.NotImplemented, str(exc) or None)
        case _:
            return S3Error(Code.InternalError)


def _not_modified_headers(exc: errors.NotModified) -> dict[str, str]:
    headers = {"ETag": exc.etag}
    if isinstance(exc.last_modified, datetime):
        headers["Last-Modified"] = format_datetime(exc.last_modified.astimezone(UTC), usegmt=True)
    return headers
