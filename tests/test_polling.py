"""The tests' poll loop fails, saying so, when the process it waits on exits first."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.polling import WaitError, wait_until


def test_a_wait_fails_when_its_process_exits_before_the_condition_holds():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    with pytest.raises(WaitError, match=r"waiting for rows: the process exited \(0\) first"):
        wait_until(lambda: False, "rows", timeout=60, proc=proc)


def test_what_the_process_did_on_its_way_out_still_counts(tmp_path):
    done = tmp_path / "done"
    proc = subprocess.Popen([sys.executable, "-c", f"open({str(done)!r}, 'w').close()"])
    proc.wait()
    assert wait_until(done.exists, "the file", timeout=60, proc=proc)


def test_a_wait_gives_up_at_its_bound():
    with pytest.raises(WaitError, match="not within 0 s"):
        wait_until(lambda: False, "nothing", timeout=0.1)
