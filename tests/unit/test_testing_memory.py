"""The child-peak measurement used by the drain's memory test and bench/drain.py: a
child's ``ru_maxrss`` carries its parent's size over exec; ``VmHWM`` does not."""

from __future__ import annotations

import subprocess
import sys

from airflow_pgcdc.testing.memory import vm_hwm, wait_with_peak

BALLAST = 400 << 20


def test_a_child_peak_is_its_own_not_its_parents():
    ballast = bytearray(BALLAST)  # resident: bytearray zero-fills
    try:
        child = "x = bytearray(50 << 20); import time; time.sleep(0.3)"
        proc = subprocess.Popen([sys.executable, "-c", child])
        code, peak, usage = wait_with_peak(proc)
        assert code == 0
        # the trap this module exists for: wait4 reports the parent's resident set
        assert usage.ru_maxrss * 1024 >= BALLAST, "ru_maxrss no longer inherits the parent's size"
        assert 50 << 20 <= peak < 200 << 20, f"child peak {peak >> 20} MB"
    finally:
        del ballast


def test_vm_hwm_of_self_and_of_a_gone_process():
    assert vm_hwm() > 0
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert vm_hwm(proc.pid) is None
