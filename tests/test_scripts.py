"""``scripts/test-packages``: the system packages the test command may install, and how not to.

The script runs against a PATH of stand-ins: an ``apt-get`` that records its
arguments and an ``id`` that says root, so no package is installed and the
test does not depend on who runs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.harness import REPO

SCRIPT = REPO / "scripts" / "test-packages"


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir, calls = tmp_path / "bin", tmp_path / "apt-calls"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "id").write_text("#!/bin/sh\necho 0\n")  # root, whoever runs the test
    for stand_in in ("apt-get", "id"):
        (bin_dir / stand_in).chmod(0o755)
    result = subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(SCRIPT)], capture_output=True, text=True,
        timeout=30, env={"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/"), **env},
    )  # fmt: skip
    return result, calls


def test_as_root_it_installs_what_is_missing_with_apt_get(tmp_path):
    result, calls = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert calls.read_text().splitlines() == [
        "update -qq",
        "install -y -qq --no-install-recommends prometheus rclone",
    ]


def test_hoard_test_no_apt_skips_it_and_says_so(tmp_path):
    result, calls = _run(tmp_path, HOARD_TEST_NO_APT="1")
    assert result.returncode == 0, result.stderr
    assert not calls.exists()
    assert result.stderr.strip() == (
        "HOARD_TEST_NO_APT=1: not installing prometheus rclone; their live tests will be skipped"
    )
