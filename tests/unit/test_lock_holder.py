"""Whether the holder of a Delta root's lock is known to be gone (airflow_pgcdc.lake.lock):
on this machine, by its pid and the process's start time; elsewhere, never."""

from __future__ import annotations

import os
import subprocess
import sys

from airflow_pgcdc.lake.lock import holder_gone, process_start, this_process


def test_this_process_is_not_gone_and_a_finished_one_is():
    me = this_process()
    assert me["pid"] == os.getpid() and me["pid_start"] == process_start(os.getpid())
    assert not holder_gone(dict(me), me)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start(child.pid)
    child.wait()
    assert process_start(child.pid) is None
    assert holder_gone({**me, "pid": child.pid, "pid_start": start}, me)
    # the pid taken by another process since: its start time differs
    assert holder_gone({**me, "pid_start": str(int(me["pid_start"]) - 1)}, me)


def test_a_holder_that_cannot_be_seen_from_here_is_not_gone():
    me = this_process()
    dead = {**me, "pid": 2**22 + 12345}  # above pid_max's usual 2**22: no such process
    assert holder_gone(dead, me)
    assert not holder_gone({**dead, "host": "elsewhere"}, me)
    assert not holder_gone({**dead, "boot_id": "another boot"}, me)
    assert not holder_gone({**dead, "pid_ns": "pid:[1]"}, me)  # another container on this host
    old_format = {k: v for k, v in dead.items() if k not in ("pid_start", "boot_id", "pid_ns")}
    assert not holder_gone(old_format, me)
    assert not holder_gone({**dead, "pid": "12"}, me)
    assert not holder_gone(dead, {**me, "boot_id": None})  # no /proc here: nothing is known
