"""The documentation site builds with warnings as errors (a broken link, a page missing
from the navigation, an anchor that does not exist)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_docs_build_strictly(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "settings" / "index.html").exists()
