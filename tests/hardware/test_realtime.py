"""Real-time scheduling of the deploy node (`realtime_priority:=`): every thread of its process under SCHED_FIFO,
DDS's own threads included, so that load on the machine no longer sets the latency tail (bench/ros2.py)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import pytest

from robotrl.hardware import nodes
from robotrl.hardware.deploy import DeployConfig
from robotrl.hardware.realtime import make_realtime, process_threads, scheduler_of, set_fifo, thread_ids

DOMAIN = int(os.environ["ROS_DOMAIN_ID"]) + 4  # apart from the other ROS tests (conftest.py)


def schedulers() -> set[str]:
    """What the process's threads run under; a thread that ends between the listing and the query is skipped
    (an earlier test's thread pool may still be winding down)."""
    out = set()
    for tid in thread_ids():
        with contextlib.suppress(ProcessLookupError):
            out.add(scheduler_of(tid))
    return out


def test_fifo_reaches_every_thread_and_reverts() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        refused = set_fifo(10)
        if refused:  # an unprivileged process: a clear message, and the process runs on unchanged
            assert "refused" in refused[0]
            assert schedulers() == {"other"}
        else:
            assert len(thread_ids()) >= 2 and schedulers() == {"fifo 10"}
    finally:
        set_fifo(0)
        stop.set()
        worker.join()
    assert schedulers() == {"other"}
    assert make_realtime(0) == []  # off: nothing is touched
    with pytest.raises(
        ValueError, match=r"realtime_priority: expected 0 \(off\) or a SCHED_FIFO priority in 1..99, got 100"
    ):
        set_fifo(100)
    with pytest.raises(
        ValueError, match=r"DeployConfig.realtime_priority: expected 0 \(off\) or a SCHED_FIFO priority"
    ):
        DeployConfig(policy="p", realtime_priority=-1)


def test_deploy_node_started_as_launched_runs_every_thread_fifo(pusht_export: Path, tmp_path: Path) -> None:
    """Started as the launch file starts it (its parameter file asks for `realtime_priority: 50`, ros2_control's
    default): once up, all of its threads (executor, DDS receive and event threads, onnxruntime) run under
    SCHED_FIFO 50 -- or, where the OS refuses it, the node says so and runs on the default scheduler."""
    procs = nodes.start({"deploy": {"policy": str(pusht_export)}}, tmp_path, DOMAIN)
    try:
        log = tmp_path / "deploy.log"
        end = time.monotonic() + 60
        while "deploying" not in (log.read_text() if log.exists() else "") and time.monotonic() < end:
            assert procs["deploy"].poll() is None, log.read_text()
            time.sleep(0.1)
        time.sleep(0.5)  # make_realtime runs right after the "deploying" line
        text = log.read_text()
        assert "deploying" in text, text
        pid = procs["deploy"].pid
        kinds = {scheduler_of(t) for t in process_threads(pid)}
        if "refused" in text:  # no privilege here: the node said so and runs on the default scheduler
            assert kinds == {"other"}
        else:
            assert len(process_threads(pid)) > 3 and kinds == {"fifo 50"}, kinds
        assert procs["deploy"].poll() is None
    finally:
        nodes.stop(procs)
