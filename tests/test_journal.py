"""The node's invalidation journal (gateway/metadata/journal.py), with real sibling processes."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from gateway.core.invalidation import Invalidation
from gateway.metadata.journal import EVERYTHING, RING, Journal


def _publish_from_sibling(path: Path, items: list[Invalidation]) -> None:
    """Publish ``items`` from another process (a sibling worker), then exit."""

    def sibling() -> None:
        journal = Journal(path)
        journal.open()
        journal.publish(items)
        journal.close()

    process = multiprocessing.get_context("fork").Process(target=sibling)
    process.start()
    process.join(30)
    assert process.exitcode == 0


def _opened(path: Path) -> Journal:
    journal = Journal(path)
    journal.open()
    return journal


def test_a_siblings_invalidations_arrive_once_in_order(tmp_path):
    journal = _opened(tmp_path / "journal")
    assert journal.news() == []
    items = [Invalidation("s3", "b", key="a/1"), Invalidation("s3", "b", prefix="a/"),
             Invalidation("s3", "b", key="ключ\n"), Invalidation("s3", "b", key="bad\udcff")]  # fmt: skip
    _publish_from_sibling(tmp_path / "journal", items)
    assert journal.news() == items
    assert journal.news() == []


def test_own_invalidations_are_not_applied_twice(tmp_path):
    journal = _opened(tmp_path / "journal")
    journal.publish([Invalidation("s3", "b", key="k")])
    assert journal.news() == []


def test_falling_behind_the_ring_or_a_drop_all_means_forget_everything(tmp_path):
    journal = _opened(tmp_path / "journal")
    _publish_from_sibling(
        tmp_path / "journal", [Invalidation("s3", "b", key=str(i)) for i in range(RING + 1)]
    )
    assert journal.news() is None
    assert journal.news() == []
    _publish_from_sibling(tmp_path / "journal", [Invalidation("s3", "b", key="x"), EVERYTHING])
    assert journal.news() is None


def test_a_row_learned_before_a_write_is_not_believed(tmp_path):
    journal = _opened(tmp_path / "journal")
    learned = journal.seq()
    assert journal.current("s3", "b", "k", learned)
    _publish_from_sibling(tmp_path / "journal", [Invalidation("s3", "b", key="k")])
    assert not journal.current("s3", "b", "k", learned)
    assert journal.current("s3", "b", "other", learned)
    assert journal.current("s3", "b", "k", journal.seq())  # learned after the write: fine

    _publish_from_sibling(tmp_path / "journal", [Invalidation("s3", "b", prefix="x/")])
    later = journal.seq() - 1
    assert not journal.current("s3", "b", "other", later)  # a prefix: the bucket is suspect
    assert journal.current("s3", "another-bucket", "other", later)

    journal.publish([EVERYTHING])
    assert not journal.current("s3", "another-bucket", "other", later)


def test_a_key_too_long_for_a_slot_is_published_as_its_bucket(tmp_path):
    journal = _opened(tmp_path / "journal")
    _publish_from_sibling(tmp_path / "journal", [Invalidation("s3", "b", key="k" * 5000)])
    assert journal.news() == [Invalidation("s3", "b", prefix="")]


def test_a_damaged_file_is_rebuilt_and_sequence_numbers_keep_growing(tmp_path):
    path = tmp_path / "journal"
    journal = _opened(path)
    journal.publish([Invalidation("s3", "b", key="k")])
    before = journal.seq()
    journal.close()
    path.write_bytes(b"garbage")
    journal = _opened(path)
    assert journal.news() == []
    assert journal.seq() >= before  # started from the clock: old rows stay older
