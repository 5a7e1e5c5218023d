"""Small clients of Hoard's own endpoints (``/_hoard/...``), for the CLI and for training code.

They are synchronous on purpose: the CLI and a data loader's sampler call them
from plain Python, outside any event loop.
"""

from gateway.client.bundle import bundle
from gateway.client.prefetch import prefetch

__all__ = ["bundle", "prefetch"]
