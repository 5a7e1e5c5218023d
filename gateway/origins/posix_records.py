"""The record kept beside a posix object's bytes: its attributes and the ETag it was given.

S3 keeps, with each object, what the PUT said about it: Content-Type, user
metadata, the representation headers it returns on GET/HEAD (Cache-Control,
Content-Disposition, Content-Encoding, Content-Language, Expires) and the
ETag it answered. A directory tree keeps only bytes, so the posix origin
stores these as one JSON blob in the ``user.hoard.meta`` extended attribute of
the file, with the file's (size, mtime_ns, inode) at commit. Reads serve the
stored ETag while those three still match, else the fingerprint ETag of
``posix.py``: a file changed behind Hoard's back gets a new ETag, as it must.

The blob is written on the open temp file before its rename
(``posix_files.py``), so a record always names exactly the bytes it was
stored with; an xattr write that moved the file's mtime is stored again.

NOT guaranteed:

- Without xattr support (ENOTSUP: many NFS servers, some FUSE mounts), only
  the bytes are kept: HEAD then guesses the content type, shows no metadata,
  and gives the fingerprint ETag, not the one the PUT returned. Such a
  filesystem (by ``st_dev``) is remembered and not asked again.
- Metadata stays with the inode: an in-place rewrite behind Hoard's back keeps
  the stored Content-Type and metadata (the ETag does move).
- A blob that is not ours or is damaged is ignored, never an error.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mimetypes
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gateway.core.errors import MetadataTooLarge
from gateway.origins.base import ObjectInfo

META_XATTR = "user.hoard.meta"

REPRESENTATION_HEADERS = (
    "Cache-Control",
    "Content-Disposition",
    "Content-Encoding",
    "Content-Language",
    "Expires",
)

_NO_XATTR = frozenset({errno.ENOTSUP, errno.EOPNOTSUPP})

_XATTR_TOO_BIG = frozenset({errno.E2BIG, errno.ENOSPC, errno.ERANGE})


@dataclass(frozen=True, slots=True)
class Attrs:
    """What is stored beside the bytes: Content-Type, user metadata, representation headers."""

    content_type: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)  # names without x-amz-meta-
    headers: dict[str, str] = field(default_factory=dict)  # canonical names

    @classmethod
    def of(
        cls,
        content_type: str | None = None,
        metadata: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Attrs:
        """Metadata names lower-cased (as S3 returns them); headers kept if representation ones."""
        canonical = {name.lower(): name for name in REPRESENTATION_HEADERS}
        return cls(
            content_type or None,
            {name.lower(): value for name, value in (metadata or {}).items()},
            {
                canonical[name.lower()]: value
                for name, value in (headers or {}).items()
                if name.lower() in canonical
            },
        )


@dataclass(frozen=True, slots=True)
class Record:
    """The ``user.hoard.meta`` blob: attributes, plus the ETag valid for one version of the bytes."""

    etag: str
    fingerprint: tuple[int, int, int]  # (size, mtime_ns, inode) at commit
    attrs: Attrs

    def etag_for(self, st: os.stat_result) -> str | None:
        """The stored ETag if ``st`` is still the file it was stored for."""
        return self.etag if (st.st_size, st.st_mtime_ns, st.st_ino) == self.fingerprint else None


class Records:
    """Reads and writes records; remembers filesystems (by st_dev) that have no user xattrs."""

    def __init__(self) -> None:
        self._unsupported: set[int] = set()  # st_dev values answered ENOTSUP

    def read(self, file: str | int, st: os.stat_result) -> Record | None:
        """The record of a path or descriptor whose stat is ``st``; None if absent or unreadable."""
        if st.st_dev in self._unsupported or not hasattr(os, "getxattr"):
            return None
        try:
            blob = json.loads(os.getxattr(file, META_XATTR))
            content_type = blob["content_type"]
            attrs = Attrs(
                None if content_type is None else str(content_type),
                {str(k): str(v) for k, v in blob["metadata"].items()},
                {str(k): str(v) for k, v in blob["headers"].items()},
            )
            size, mtime_ns, ino = (int(n) for n in blob["fingerprint"])
            return Record(str(blob["etag"]), (size, mtime_ns, ino), attrs)
        except OSError as err:
            if err.errno in _NO_XATTR:
                self._unsupported.add(st.st_dev)
            return None  # ENODATA (a file not written by Hoard), or it vanished
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # not ours, or damaged: the fingerprint ETag is still right

    def store(self, fd: int, st: os.stat_result, etag: str, attrs: Attrs) -> os.stat_result:
        """Store a record for the open file ``fd`` whose stat is ``st``; the stat after."""
        self._write(fd, st, etag, attrs)
        after = os.fstat(fd)  # an xattr write should not move mtime; if it did, store again
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            self._write(fd, after, etag, attrs)
        return after

    def _write(self, fd: int, st: os.stat_result, etag: str, attrs: Attrs) -> None:
        if st.st_dev in self._unsupported or not hasattr(os, "setxattr"):
            return
        blob = {
            "etag": etag,
            "fingerprint": [st.st_size, st.st_mtime_ns, st.st_ino],
            "content_type": attrs.content_type,
            "metadata": attrs.metadata,
            "headers": attrs.headers,
        }
        try:
            os.setxattr(fd, META_XATTR, json.dumps(blob, separators=(",", ":")).encode())
        except OSError as err:
            if err.errno in _NO_XATTR:
                self._unsupported.add(st.st_dev)  # documented: keep only the bytes
            elif err.errno in _XATTR_TOO_BIG:
                raise MetadataTooLarge("The metadata does not fit in the origin's xattrs") from err
            else:
                raise


def last_modified(st: os.stat_result) -> datetime:
    """Whole seconds, for HEAD and listings alike: HTTP dates carry no more."""
    return datetime.fromtimestamp(st.st_mtime_ns // 1_000_000_000, tz=UTC)


def etag_of(st: os.stat_result) -> str:
    """A quoted, MD5-shaped fingerprint of (size, mtime_ns, inode); some clients parse ETags."""
    material = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode()
    return '"' + hashlib.blake2b(material, digest_size=16).hexdigest() + '"'


def guessed_content_type(key: str) -> str:
    kind, encoding = mimetypes.guess_type(key.rsplit("/", 1)[-1], strict=False)
    # "x.csv.gz" guesses text/csv + gzip. The bytes are gzip, and sending
    # Content-Encoding would make HTTP clients inflate them: treat as opaque.
    return kind if kind and not encoding else "binary/octet-stream"


def object_info(key: str, st: os.stat_result, record: Record | None) -> ObjectInfo:
    if record is None:
        return ObjectInfo(
            key, st.st_size, etag_of(st), last_modified(st), guessed_content_type(key)
        )
    return ObjectInfo(
        key,
        st.st_size,
        record.etag_for(st) or etag_of(st),
        last_modified(st),
        record.attrs.content_type or guessed_content_type(key),
        metadata=dict(record.attrs.metadata),
        headers=dict(record.attrs.headers),
    )
