"""Real-time scheduling for a control process, as ros2_control's controller manager sets up its update loop: the
process's threads under SCHED_FIFO, its memory locked, and Python's garbage collector kept off what start-up
allocated.

Under the default scheduler a control step waits for whatever else holds the core (a training job, a compiler,
the browser on the robot's PC) for up to a time slice, several milliseconds: that, not the policy, is the tail of
the observation-to-command latency. A FIFO thread preempts every normal one as soon as it is runnable. Every
thread matters, not only the executor's: Fast DDS delivers a message from its own receive thread, which would
otherwise queue behind the same load. On a robot this wants a PREEMPT_RT kernel and a user in the realtime group
(`rtprio` in /etc/security/limits.conf), as franka_ros2 and ur_robot_driver ask for their own control loops."""

from __future__ import annotations

import ctypes
import gc
import os
from pathlib import Path

MCL_CURRENT, MCL_FUTURE = 1, 2


def thread_ids() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


def set_fifo(priority: int) -> list[str]:
    """SCHED_FIFO at `priority` (1-99) for every thread of this process (threads created later inherit it), or
    back to the default scheduler with 0; what could not be applied, one line each."""
    if not 0 <= priority <= 99:
        raise ValueError(f"realtime_priority: expected 0 (off) or a SCHED_FIFO priority in 1..99, got {priority}")
    policy = os.SCHED_FIFO if priority else os.SCHED_OTHER
    problems = []
    for tid in thread_ids():
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(priority))
        except PermissionError:
            return [f"SCHED_FIFO {priority} refused (needs CAP_SYS_NICE or an rtprio limit): running without it"]
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except OSError as e:
            problems.append(f"thread {tid}: {e}")
    return problems


def lock_memory() -> list[str]:
    """mlockall: no page fault (a disk read, on a swapped page) in the middle of a control step."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mlockall(MCL_CURRENT | MCL_FUTURE) != 0:
        return [f"mlockall refused ({os.strerror(ctypes.get_errno())}): memory not locked (raise RLIMIT_MEMLOCK)"]
    return []


def make_realtime(priority: int) -> list[str]:
    """The whole set-up, for a node that has started its threads: FIFO at `priority`, locked memory, and the
    objects of start-up moved out of the collector's generations (`gc.freeze`), so a full collection during
    control scans only what the loop allocates. Returns what could not be applied; the caller warns and runs on.
    0 leaves the process as it is."""
    if priority == 0:
        return []
    problems = set_fifo(priority)
    if not problems:
        problems += lock_memory()
    gc.freeze()
    return problems


def scheduler_of(tid: int) -> str:
    """'fifo <priority>' or 'other': what a thread runs under (for tests and diagnostics)."""
    policy = os.sched_getscheduler(tid)
    return f"fifo {os.sched_getparam(tid).sched_priority}" if policy == os.SCHED_FIFO else "other"


def process_threads(pid: int) -> list[int]:
    """The thread ids of another process (to check what it runs under)."""
    return [int(t) for t in os.listdir(Path("/proc") / str(pid) / "task")]
