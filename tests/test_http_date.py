"""Last-Modified as S3 writes it, formatted once per second shown, not per datetime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from email.utils import format_datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.s3 import xml

_ZONES = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)


@settings(max_examples=400)
@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=_ZONES)
)
def test_http_date_is_the_moment_in_gmt_to_the_second(moment: datetime) -> None:
    assert xml.http_date(moment) == format_datetime(moment.astimezone(UTC), usegmt=True)


def test_moments_of_one_second_share_one_formatting() -> None:
    xml._http_date_of.cache_clear()
    base = datetime(2026, 11, 29, 10, 0, 1, tzinfo=UTC)
    for micro in (0, 1, 500_000, 999_999):
        assert xml.http_date(base.replace(microsecond=micro)) == "Sun, 29 Nov 2026 10:00:01 GMT"
    assert xml._http_date_of.cache_info().currsize == 1
