"""Peak memory of a child process, measured the one way that is right on Linux.

``getrusage``/``wait4``'s ``ru_maxrss`` is *not* the child's own peak: the kernel keeps
the largest resident set the process ever had, and at ``execve`` it carries over the
resident set of the memory image being replaced, which for a child started by
``subprocess`` (fork or vfork, then exec) is the *parent's*. A drain started from a
600 MB pytest process reports ``ru_maxrss`` of 600 MB whatever it does itself. The
high-water mark of the process' current memory image, ``VmHWM`` in
``/proc/PID/status``, starts afresh at exec: that is the figure to use.
"""

from __future__ import annotations

import os
import subprocess
import time

__all__ = ["vm_hwm", "wait_with_peak"]


def vm_hwm(pid: int | str = "self") -> int | None:
    """``VmHWM`` of ``pid`` in bytes (its peak resident set since its last exec), or
    ``None`` when the process is gone (or a zombie: the kernel has dropped its memory)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def wait_with_peak(proc: subprocess.Popen, interval: float = 0.05) -> tuple[int, int, os.struct_rusage | None]:
    """Wait for ``proc``; returns ``(returncode, peak_bytes, rusage)``. The peak is the
    last ``VmHWM`` read while the process lived (read every ``interval`` seconds; the
    mark only grows, so it misses at most the final interval's growth); ``rusage`` is
    ``wait4``'s (CPU times are right; ignore its ``ru_maxrss``, see the module doc)."""
    peak = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, peak, usage
        peak = max(peak, vm_hwm(proc.pid) or 0)
        time.sleep(interval)
