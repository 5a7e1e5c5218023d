"""ListParts and ListMultipartUploads for origins written through (``writes.py``).

The writer keeps the uploads and their parts; these handlers page them as
S3 does: at most ``LIST_LIMIT`` a page, parts after ``part-number-marker``,
uploads after ``key-marker`` (and, for that key, after ``upload-id-marker``),
keys under ``prefix`` rolled up at ``delimiter`` into common prefixes that
count towards the page like uploads, each shown once across pages.
"""

from __future__ import annotations

from aiohttp import web

from gateway.s3 import xml_writes
from gateway.s3.call import Call
from gateway.s3.listing import url_encoding_requested
from gateway.s3.numbers import query_integer
from gateway.s3.xml import XML_TYPE
from gateway.write.writer import UploadInfo

LIST_LIMIT = 1000  # max-parts and max-uploads are capped here, as S3 does


async def list_parts(call: Call) -> web.StreamResponse:
    max_parts = min(query_integer(call.query, "max-parts", LIST_LIMIT), LIST_LIMIT)
    marker = query_integer(call.query, "part-number-marker", 0)
    encode = url_encoding_requested(call.query)
    upload_id = call.query["uploadId"]
    parts = await call.writer.list_parts(call.bucket, call.key, upload_id)
    after = [part for part in parts if part.part_number > marker]
    body = xml_writes.list_parts(
        call.bucket,
        call.key,
        upload_id,
        after[:max_parts],
        part_number_marker=marker,
        max_parts=max_parts,
        truncated=len(after) > max_parts,
        encode=encode,
    )
    return web.Response(body=body, content_type=XML_TYPE)


async def list_multipart_uploads(call: Call) -> web.StreamResponse:
    query = call.query
    prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
    key_marker = query.get("key-marker", "")
    id_marker = query.get("upload-id-marker", "") if key_marker else ""  # S3 ignores it alone
    max_uploads = min(query_integer(query, "max-uploads", LIST_LIMIT), LIST_LIMIT)
    encode = url_encoding_requested(query)
    found = await call.writer.list_multipart_uploads(call.bucket, prefix)
    uploads: list[UploadInfo] = []
    prefixes: list[str] = []
    truncated, last = False, None  # last: (key or prefix, upload id) shown last
    for upload in _after(found, key_marker, id_marker):
        cut = upload.key.find(delimiter, len(prefix)) if delimiter else -1
        rolled = upload.key[: cut + len(delimiter)] if cut >= 0 else None
        if rolled is not None and (rolled in prefixes or rolled <= key_marker):
            continue  # already shown, on this page or an earlier one
        if len(uploads) + len(prefixes) == max_uploads:
            truncated = True
            break
        if rolled is not None:
            prefixes.append(rolled)
            last = (rolled, "")
        else:
            uploads.append(upload)
            last = (upload.key, upload.upload_id)
    body = xml_writes.list_multipart_uploads(
        call.bucket,
        uploads,
        prefixes,
        prefix=prefix,
        delimiter=delimiter,
        key_marker=key_marker,
        upload_id_marker=id_marker,
        next_markers=last,
        max_uploads=max_uploads,
        truncated=truncated,
        encode=encode,
    )
    return web.Response(body=body, content_type=XML_TYPE)


def _after(uploads: list[UploadInfo], key_marker: str, id_marker: str) -> list[UploadInfo]:
    """The uploads a page starts from: after ``key_marker``, or after the marked upload of it."""
    if not key_marker:
        return uploads
    same = [u for u in uploads if u.key == key_marker] if id_marker else []
    ids = [u.upload_id for u in same]
    if id_marker in ids:
        same = same[ids.index(id_marker) + 1 :]
    else:
        same = [u for u in same if u.upload_id > id_marker]
    return same + [u for u in uploads if u.key > key_marker]
