"""Which client keys may name a file of a posix origin: checked as text before any path.

Keys come from clients, so a key is checked as text before it becomes a path:
no NUL, no empty, ``.`` or ``..`` component, no leading ``/``, valid UTF-8.
Names of files being written (``.hoard-tmp-*``, ``posix_files.py``) are
reserved and never keys. Containment in the bucket's folder (after
``realpath``) is the origin's second check (``posix.py``): these rules say nothing of symlinks.
"""

from __future__ import annotations

from gateway.core import errors
from gateway.origins.posix_files import TEMP_PREFIX


def utf8(text: str) -> bool:
    # scandir smuggles undecodable bytes in as lone surrogates; those are no S3 key.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def safe_relpath(rel: str) -> bool:
    """Whether ``rel`` names a path strictly below a directory, with no tricks."""
    if not rel or "\0" in rel or not utf8(rel):
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def check_key(key: str) -> None:
    body = key[:-1] if key.endswith("/") else key
    if not safe_relpath(body):
        raise errors.InvalidObjectName(f"The key cannot name a file safely: {key!r}")
    if key.endswith("/"):
        raise errors.NoSuchKey(key)  # a "folder" key: directories are not objects
    if is_temp(body.rpartition("/")[2]):
        raise errors.NoSuchKey(key)  # a write in progress (or a crashed one's leftover)


def is_temp(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)
