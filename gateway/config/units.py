"""Quantities in the config: sizes (``8MiB``), durations (``30s``, ``forever``), umasks.

Strict parsers that name what they refuse; each is also a pydantic type
(``Size``, ``Duration``, ``Umask``) the settings models annotate their fields
with, and other modules call the parsers for values from elsewhere (a warm
job's spec, a prefetch order).
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
}
_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# ASCII digits of bounded length: sizes and durations also arrive from clients (a prefetch
# window, a pin_ttl), and "\d" reads any script's digits; 5,000 of them overflowed int().
_QUANTITY = re.compile(r"^\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([a-zA-Z]*)\s*$", re.ASCII)


def parse_size(value: object) -> int:
    """``"8MiB"`` → 8388608. Accepts ints, binary (KiB…TiB) and SI (KB…TB) units."""
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid size {value!r}: must not be negative")
        return value
    match = _QUANTITY.match(str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"invalid size {value!r} (expected e.g. 512MiB, 8GiB, 1TiB)")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_duration(value: object) -> float:
    """``"5m"`` → 300.0 seconds; ``"forever"`` → ``math.inf``."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, int | float):
        if not value >= 0:  # negative, or NaN (JSON lets a client send one)
            raise ValueError(f"invalid duration {value!r}: must not be negative")
        return float(value)
    text = str(value).strip().lower()
    if text in ("forever", "inf", "never"):
        return math.inf
    match = _QUANTITY.match(text)
    unit = match.group(2) if match else None
    if match is None or unit not in _DURATION_UNITS:
        raise ValueError(f"invalid duration {value!r} (expected e.g. 30s, 5m, 1h, forever)")
    return float(match.group(1)) * _DURATION_UNITS[unit]


Size = Annotated[int, BeforeValidator(parse_size)]
Duration = Annotated[float, BeforeValidator(parse_duration)]


def parse_umask(value: object) -> int:
    """A umask in octal: ``"077"``, ``"0o027"`` (YAML's ``0077`` arrives as the int 63)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0o777:
        return value
    text = str(value).strip().lower().removeprefix("0o")
    if not text or len(text) > 4 or any(c not in "01234567" for c in text):
        raise ValueError(f"invalid umask {value!r} (octal, such as 077 or 027)")
    return int(text, 8) & 0o777


Umask = Annotated[int, BeforeValidator(parse_umask)]
