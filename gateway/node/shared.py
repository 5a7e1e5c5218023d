"""A JSON document one worker of a node writes and every worker reads.

The leader writes what it alone learns (the cluster's membership, say) to a
file in the cache directory; the others read it on their own schedule. The
file is replaced atomically (written aside, then renamed), so a reader sees
the old document or the new one, never half of either, and a writer killed
mid-write leaves the old one. A document that cannot be read is None: the
reader keeps what it had.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from gateway.node.leader import Leadership

log = logging.getLogger(__name__)


class SharedDocument:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, body: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(json.dumps(body, separators=(",", ":")).encode())
        os.replace(tmp, self.path)

    def read(self, max_age: float | None = None) -> dict[str, Any] | None:
        """The document, or None if there is none, it is damaged, or it was last
        written more than ``max_age`` seconds ago (its writer is gone)."""
        try:
            if max_age is not None and time.time() - self.path.stat().st_mtime > max_age:
                return None
            body = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("node document %s unreadable: %s", self.path, exc)
            return None
        return body if isinstance(body, dict) else None


class LeaderDocument(SharedDocument):
    """A shared document that the node's leader writes: ``leads`` says whether that is us."""

    def __init__(self, path: Path, leadership: Leadership) -> None:
        super().__init__(path)
        self._leadership = leadership

    @property
    def leads(self) -> bool:
        return self._leadership.leads
