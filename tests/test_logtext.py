"""Log records stay one line each (gateway/core/logtext.py): values from requests are escaped."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from gateway.core.logtext import install, one_line

FORGED = "x\n2026-01-01 00:00:00,000 1 WARNING hoard forged\r\x1b[2J\u2028"


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger writing to a string through a handler set up as ``cli.py`` sets them up."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger(f"test-logtext-{id(stream)}")
    logger.propagate = False
    logger.addHandler(handler)
    install(logger)
    yield logger, stream
    logger.removeHandler(handler)


def test_one_line_escapes_what_is_not_printable() -> None:
    assert one_line("data/train/0001.bin") == "data/train/0001.bin"
    assert one_line("a\nb\tc\x1bd\u2028e\U000e0001") == "a\\x0ab\\x09c\\x1bd\\u2028e\\U000e0001"


def test_a_value_with_a_newline_cannot_forge_a_line(logged) -> None:
    logger, stream = logged
    logger.warning("auto-warm: %s read cold %d times", f"data/{FORGED}/", 16)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("WARNING ") and "read cold 16 times" in lines[0]
    assert "\\x0a2026-01-01" in lines[0] and "\\x1b[2J" in lines[0] and "\\u2028" in lines[0]


def test_a_traceback_keeps_its_lines_and_escapes_the_exception_message(logged) -> None:
    logger, stream = logged
    try:
        try:
            raise KeyError(FORGED)
        except KeyError as exc:
            raise ValueError(f"no such key {FORGED}") from exc
    except ValueError:
        logger.exception("unhandled error, request %s", "req\nWARNING hoard forged")
    lines = stream.getvalue().splitlines()
    structure = ("Traceback (", "  ", "The above exception", "KeyError: ", "ValueError: ")
    assert all(line == "" or line.startswith(structure) for line in lines[1:]), lines
    assert lines[0].startswith("ERROR ") and "req\\x0aWARNING" in lines[0]
    assert lines[1] == "Traceback (most recent call last):"
    assert any(line.startswith('  File "') for line in lines)
    assert any("direct cause of the following exception" in line for line in lines)
    assert lines[-1].startswith("ValueError: no such key x\\x0a2026-01-01")


def test_install_is_idempotent(logged) -> None:
    logger, stream = logged
    install(logger)
    logger.warning("%s", "a\\b")  # a backslash is printable: logged as it is
    assert stream.getvalue() == "WARNING " + logger.name + " a\\b\n"
