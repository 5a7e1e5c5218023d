"""The node's prefetch streams: registrations and positions every worker shares.

A registration may reach any worker of a node, and a stream's GETs reach all
of them; one worker, the node's leader, does the fetching (``node.py``). What
they share lives in ``cache.dir/prefetch/``:

  index.json      stream id → its slot, registration serial, bucket, window,
                  and whether it is active (a peer's registration waits for a GET)
  <serial>.keys   the order's keys, written once per registration (JSON list)
  streams         a mapped file: a header with the index's ``generation``
                  (bumped at every change, so a worker re-reads the index only
                  then), and one fixed slot per stream (``prefetch.max_streams``)

A slot holds what moves on every GET and every fetch, in place:

  serial, observed seq, observed index, observed time    written by any worker
  applied serial, applied seq, status numbers           written by the leader

A worker serving a GET of a key in an order writes the key's index and bumps
the observed seq (no lock: two GETs at once leave one of their indexes, which
is all a position is); the leader moves the stream there and publishes its
status with the seq it has applied, so a status read anywhere can tell
whether it already includes the last GET. Index changes take an exclusive
``flock`` on the mapped file.

Not guaranteed: that the file survives a change of ``max_streams`` (it is
rebuilt empty, as is a damaged one: registrations are re-made each epoch).
"""

from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.core.mapped import MappedFile
from gateway.prefetch.order import Order, OrderError

MAGIC = b"HOARDP01"
_HEADER = 64
_GENERATION_AT = 8
SLOT = 128
_OBSERVED = struct.Struct("<QQqd")  # serial, seq, index, time (time.time())
_APPLIED_AT = _OBSERVED.size
_APPLIED = struct.Struct("<QQ")  # serial, seq
_STATUS_AT = _APPLIED_AT + _APPLIED.size
STATUS_FIELDS = ("position", "next_key", "ahead_bytes", "in_flight_bytes", "lookups",
                 "fetched_bytes", "errors", "active", "idle_ms")  # fmt: skip
_STATUS = struct.Struct("<" + "q" * len(STATUS_FIELDS))
_U64 = struct.Struct("<Q")
assert _STATUS_AT + _STATUS.size <= SLOT


@dataclass(frozen=True, slots=True)
class Entry:
    """One registered stream, as the index records it."""

    stream: str
    slot: int
    serial: int
    bucket: str
    window: int
    keys: int
    active: bool

    def as_json(self) -> dict[str, Any]:
        return {"slot": self.slot, "serial": self.serial, "bucket": self.bucket,
                "window": self.window, "keys": self.keys, "active": self.active}  # fmt: skip


class Registry(MappedFile):
    """One worker's view of the node's prefetch directory."""

    def __init__(self, directory: Path, slots: int) -> None:
        super().__init__()
        self._directory = directory
        self._slots = slots
        self._size = _HEADER + slots * SLOT

    def open(self) -> None:
        self._open_mapped(self._directory / "streams", self._size, MAGIC, self._fresh)

    def _fresh(self) -> None:
        os.pwrite(self._fd, MAGIC + _U64.pack(1), 0)
        self._write_index({})
        for orphan in self._directory.glob("*.keys"):  # of the index just emptied
            orphan.unlink(missing_ok=True)

    # -- registrations (rare: under the lock) -------------------------------------------

    def generation(self) -> int:
        """Bumped at every registration and drop: re-read ``entries`` when it moved."""
        assert self._map is not None
        return _U64.unpack_from(self._map, _GENERATION_AT)[0]

    def entries(self) -> dict[str, Entry]:
        try:
            raw = json.loads((self._directory / "index.json").read_bytes())
            return {stream: Entry(stream, **body) for stream, body in raw.items()}
        except (OSError, ValueError, TypeError, AttributeError):  # damaged: as if empty
            return {}

    def register(self, order: Order, active: bool) -> Entry:
        """Record ``order`` (replacing the stream's last one); ``OrderError`` when every
        slot is taken."""
        assert self._map is not None
        with self._locked():
            entries = self.entries()
            old = entries.get(order.stream)
            taken = {e.slot for e in entries.values()}
            free = (old.slot,) if old else [s for s in range(self._slots) if s not in taken][:1]
            if not free:
                raise OrderError("TooManyStreams",
                                 f"{len(entries)} streams are registered; this gateway takes at "
                                 f"most {self._slots} (prefetch.max_streams)")  # fmt: skip
            serial = max(time.time_ns(), old.serial + 1 if old else 0)
            entry = Entry(order.stream, free[0], serial, order.bucket, order.window,
                          len(order.keys), active)  # fmt: skip
            _replace(self._directory / f"{serial}.keys", json.dumps(list(order.keys)).encode())
            self._map[self._at(entry.slot) : self._at(entry.slot) + SLOT] = bytes(SLOT)
            _OBSERVED.pack_into(self._map, self._at(entry.slot), serial, 0, -1, time.time())
            entries[order.stream] = entry
            self._write_index(entries)
            if old is not None:
                (self._directory / f"{old.serial}.keys").unlink(missing_ok=True)
        return entry

    def drop(self, stream: str, serial: int | None = None) -> bool:
        """Forget ``stream`` (only its registration ``serial``, if given)."""
        assert self._map is not None
        with self._locked():
            entries = self.entries()
            old = entries.get(stream)
            if old is None or serial not in (None, old.serial):
                return False
            del entries[stream]
            self._map[self._at(old.slot) : self._at(old.slot) + SLOT] = bytes(SLOT)
            self._write_index(entries)
            (self._directory / f"{old.serial}.keys").unlink(missing_ok=True)
        return True

    def keys(self, entry: Entry) -> tuple[str, ...] | None:
        """The order's keys, or None if the registration was replaced meanwhile."""
        try:
            return tuple(json.loads((self._directory / f"{entry.serial}.keys").read_bytes()))
        except (OSError, ValueError):
            return None

    def _write_index(self, entries: dict[str, Entry]) -> None:
        body = {stream: entry.as_json() for stream, entry in entries.items()}
        _replace(self._directory / "index.json", json.dumps(body).encode())
        if self._map is not None:
            _U64.pack_into(self._map, _GENERATION_AT, self.generation() + 1)
        else:  # being created, under the lock: the header is written already
            generation = _U64.unpack(os.pread(self._fd, 8, _GENERATION_AT))[0]
            os.pwrite(self._fd, _U64.pack(generation + 1), _GENERATION_AT)

    # -- positions and status (every GET: in place, no lock) ----------------------------

    def observe(self, entry: Entry, index: int) -> None:
        """A GET put the reader of ``entry``'s stream at ``index``."""
        assert self._map is not None
        at = self._at(entry.slot)
        serial, seq, _, _ = _OBSERVED.unpack_from(self._map, at)
        if serial == entry.serial:  # else it was replaced or dropped meanwhile
            _OBSERVED.pack_into(self._map, at, serial, seq + 1, index, time.time())

    def observed(self, entry: Entry) -> tuple[int, int, float] | None:
        """(seq, index, time) of the last GET, or None if the slot is another stream's."""
        assert self._map is not None
        serial, seq, index, when = _OBSERVED.unpack_from(self._map, self._at(entry.slot))
        return (seq, index, when) if serial == entry.serial else None

    def publish(self, entry: Entry, seq: int, status: dict[str, Any]) -> None:
        """The leader's status of ``entry``'s stream, having applied GETs up to ``seq``."""
        assert self._map is not None
        at = self._at(entry.slot)
        values = [int(status[name]) for name in STATUS_FIELDS[:-1]]
        _STATUS.pack_into(self._map, at + _STATUS_AT, *values,
                          int(status["idle_seconds"] * 1000))  # fmt: skip
        _APPLIED.pack_into(self._map, at + _APPLIED_AT, entry.serial, seq)

    def published(self, entry: Entry) -> tuple[int, dict[str, Any]] | None:
        """(applied seq, status) the leader published for ``entry``, or None if none yet."""
        assert self._map is not None
        at = self._at(entry.slot)
        serial, seq = _APPLIED.unpack_from(self._map, at + _APPLIED_AT)
        if serial != entry.serial:
            return None
        values = dict(zip(STATUS_FIELDS, _STATUS.unpack_from(self._map, at + _STATUS_AT),
                          strict=True))  # fmt: skip
        values["active"] = bool(values["active"])
        values["idle_seconds"] = values.pop("idle_ms") / 1000
        return seq, values

    def _at(self, slot: int) -> int:
        return _HEADER + slot * SLOT


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
