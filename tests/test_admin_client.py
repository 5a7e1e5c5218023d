"""gateway.client.admin against a real Hoard: signed calls pass, bad keys get the JSON error."""

from __future__ import annotations

import pytest

from gateway.client.admin import AdminClient, AdminError
from tests.harness import ACCESS_KEY, SECRET_KEY, HoardProcess


@pytest.fixture
def node(tmp_path):
    posix_root = tmp_path / "origin"
    (posix_root / "data").mkdir(parents=True)
    process = HoardProcess(tmp_path / "node", {
        "origins": {"local": {"type": "posix", "path": str(posix_root)}},
        "default_origin": "local",
    }).start()  # fmt: skip
    yield process
    process.stop()


def test_signed_call_answers_json(node):
    client = AdminClient(node.endpoint, ACCESS_KEY, SECRET_KEY)
    stats = client.call("GET", "/_hoard/stats")
    assert isinstance(stats, dict) and stats
    dropped = client.call("DELETE", "/_hoard/cache", query={"bucket": "data", "prefix": "x/"})
    assert dropped["bucket"] == "data" and dropped["prefix"] == "x/"


def test_wrong_secret_and_unknown_path_raise_admin_error(node):
    with pytest.raises(AdminError) as refused:
        AdminClient(node.endpoint, ACCESS_KEY, "not-the-secret").call("GET", "/_hoard/stats")
    assert refused.value.status == 403 and refused.value.body["error"] == "SignatureDoesNotMatch"
    with pytest.raises(AdminError) as missing:
        AdminClient(node.endpoint, ACCESS_KEY, SECRET_KEY).call("GET", "/_hoard/nothing")
    assert missing.value.status == 404
