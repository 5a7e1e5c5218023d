r"""The access log: one line per request, as text or JSON, written in batches.

The stdlib ``logging`` machinery costs more per record than a whole cached
small-object GET spends elsewhere, so request lines bypass it: each request
appends one preformatted line to a list, and the list is written to the stream
every ``interval`` seconds or every ``batch`` lines, in one write. Lines name
the request id, operation, bucket, path (never the query, which can hold a
presigned signature), status, bytes, duration and where the bytes came from;
never a header, a signature or a secret.

In the text format every field is escaped: a control character, a space, a
backslash or any other character that is not printable becomes ``\xHH``,
``\uHHHH`` or ``\\``, so a client (even an unauthenticated one, whose path is
logged too) cannot end a line, forge another one, split a field or drive a
terminal with escape sequences. Fields are never empty (``-``). The JSON
format escapes by its own rules.

Not guaranteed: lines buffered when the process is killed (SIGKILL) are lost;
a clean shutdown flushes them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import TextIO

from gateway.core.logtext import escape_char


class AccessLog:
    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        as_json: bool = False,
        enabled: bool = True,
        interval: float = 0.25,
        batch: int = 512,
    ) -> None:
        self._stream = stream or sys.stderr
        self._json = as_json
        self.enabled = enabled
        self._interval = interval
        self._batch = batch
        self._lines: list[str] = []
        self._pid = os.getpid()
        self._second = -1
        self._stamp = ""
        self._flusher: asyncio.Task[None] | None = None

    def _now(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:  # strftime once a second, not once a request
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int(now % 1 * 1000):03d}Z"

    def record(
        self,
        request_id: str,
        method: str,
        path: str,
        operation: str,
        bucket: str,
        status: int,
        sent: int,
        seconds: float,
        source: str = "-",
        error: str = "-",
        objects: int | None = None,
    ) -> None:
        """One line; ``objects``: the keys a batch GET asked for (a last field, on its lines only)."""
        if not self.enabled:
            return
        if self._json:
            line = json.dumps({
                "time": self._now(), "pid": self._pid, "request_id": request_id, "method": method,
                "path": path, "operation": operation, "bucket": bucket, "status": status,
                "bytes": sent, "duration": round(seconds, 6), "source": source, "error": error,
                **({"objects": objects} if objects is not None else {}),
            })  # fmt: skip
        else:
            line = (f"{self._now()} {self._pid} {field(request_id)} {field(method)} {field(path)} "
                    f"{field(operation)} {field(bucket)} {status} {sent} {seconds:.4f} "
                    f"{field(source)} {field(error)}")  # fmt: skip
            if objects is not None:
                line += f" objects={objects}"
        self._lines.append(line)
        if len(self._lines) >= self._batch:
            self.flush()

    def flush(self) -> None:
        if not self._lines:
            return
        lines, self._lines = self._lines, []
        try:
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()
        except (OSError, ValueError):
            pass  # a closed or full log stream must not fail requests

    async def start(self) -> None:
        self._flusher = asyncio.create_task(self._flush_forever())

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        self.flush()

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.flush()


def field(value: str) -> str:
    """``value`` as one field of a text line: no space, control or unprintable character."""
    if value.isprintable() and " " not in value and "\\" not in value:
        return value or "-"  # the common case: one scan, no copy
    return "".join(map(_escaped, value))


def _escaped(char: str) -> str:
    if char == "\\":
        return "\\\\"
    if char.isprintable() and char != " ":
        return char
    return escape_char(char)
