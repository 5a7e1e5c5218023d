"""Compiled twins: which implementation of a hot function this process runs.

A few functions on the hit path are written twice: in Python, the reference
(readable, and what runs wherever no compiler did), and in Cython
(``_name.pyx`` beside the module), built by ``pip install`` when the machine
has a C compiler (``setup.py``; the build is optional, so an install without
one still works, in pure Python). The module holding the Python functions
asks ``twin`` for the compiled module and binds its public names to whichever
it got. The tests run both over the same inputs, and the hit path's tests run
once more with ``HOARD_NO_EXTENSIONS=1`` (``scripts/test``), so neither path
drifts from the other.

``HOARD_NO_EXTENSIONS=1`` in the environment selects the Python path for the
whole process (as ``AIOHTTP_NO_EXTENSIONS`` does for aiohttp's): read once,
at import, since an implementation cannot change under a running server.
``in_use()`` says which of the ``TWINS`` run, for the start-up log and
``hoard_compiled_extension``: derived from what was imported, not recorded.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

NO_EXTENSIONS = os.environ.get("HOARD_NO_EXTENSIONS", "") not in ("", "0")
TWINS = (  # the compiled modules setup.py builds
    "gateway.core._heads",
    "gateway.s3._sigv4_claim",
    "gateway.s3._sigv4",
    "gateway.s3._signed_form",
    "gateway.s3._sigv4_repeat",
)


def twin(name: str) -> ModuleType | None:
    """The compiled module ``name``, or None (not built, or ``HOARD_NO_EXTENSIONS``)."""
    if NO_EXTENSIONS:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def in_use() -> dict[str, bool]:
    """Each of the ``TWINS``: whether its compiled module runs (it was imported, and
    the Python twins were not asked for)."""
    return {name: not NO_EXTENSIONS and name in sys.modules for name in TWINS}
