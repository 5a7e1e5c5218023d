r"""Log lines that stay lines: every value a log record carries is escaped.

Keys, prefixes, bucket names, paths, stream ids and exception messages come
from clients, and Hoard logs them (``auto-warm: data/train/ read cold...``).
A key may hold any character, a newline or an ANSI escape included, so one
logged as it is could end the line and forge the next one (a fake
``WARNING``), or drive the terminal of whoever reads the log. Rather than
trust every call site to remember, one filter on the process's log handlers
(``OneLine``, installed by ``cli.py``) escapes the finished message of every
record: each character that is not printable (``str.isprintable``: controls,
line and paragraph separators, unassigned and private characters) becomes
``\xHH``, ``\uHHHH`` or ``\UHHHHHHHH``. A traceback keeps its structure
(frames, the chaining lines), and each exception's own line, whose message
may name a key, is escaped the same way. ``escape_char`` is also the access
log's (``obs/access_log.py``), whose fields escape a few more characters.

Format strings are Hoard's own, never built from request data, and carry no
newline; the escaping does not care which part of the message a character
came from, so the rule holds for a call that forgets.

Not guaranteed: a backslash is logged as it is, so a key holding the four
characters ``\x0a`` reads like an escaped newline (it cannot end a line);
text written outside ``logging`` (``print`` at start-up, third-party
libraries writing to stderr) is not filtered.
"""

from __future__ import annotations

import logging
import traceback


def escape_char(char: str) -> str:
    """One character as ``\\xHH``, ``\\uHHHH`` or ``\\UHHHHHHHH``."""
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def one_line(text: str) -> str:
    """``text`` with every character that is not printable escaped: it fits one line."""
    if text.isprintable():
        return text  # the common case: one scan, no copy
    return "".join(c if c.isprintable() else escape_char(c) for c in text)


def exception_text(exc_info: tuple[type[BaseException], BaseException, object]) -> str:
    """A traceback as ``logging`` prints it, each exception's own line escaped.

    ``TracebackException.format`` yields a frame as one chunk starting with
    two spaces, the chaining notes starting with a newline, and an
    exception's ``Type: message`` as one chunk whatever its message holds."""
    chunks = []
    for chunk in traceback.TracebackException(*exc_info).format():  # type: ignore[arg-type]
        if chunk.startswith(("  ", "\n", "Traceback (")):
            chunks.append(chunk)  # frames and chaining: Hoard's code, one line each
        else:
            chunks.append(one_line(chunk.removesuffix("\n")) + "\n")
    return "".join(chunks).removesuffix("\n")


class OneLine(logging.Filter):
    """Escapes the finished message (and traceback) of every record it sees."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.isprintable():
            record.msg, record.args = one_line(message), None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = exception_text(record.exc_info)  # type: ignore[arg-type]
        return True


def install(logger: logging.Logger) -> None:
    """Escape every record ``logger``'s handlers write (call once the handlers exist)."""
    for handler in logger.handlers:
        if not any(isinstance(f, OneLine) for f in handler.filters):
            handler.addFilter(OneLine())
