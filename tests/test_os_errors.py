"""OS failures reach the user as one line naming the path and the cause, with nothing committed lost: a directory
the command may not write (or read), and a disk that fills up mid-run. Both are made for real: the commands run
without the capabilities that let root ignore file modes, and the full disk is a small tmpfs mounted in a private
mount namespace of the test's own shell."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.training.loop import TRAIN_STATE

ROBOTRL = str(Path(sys.executable).parent / "robotrl")
# root ignores file modes through these two capabilities; without them it is held to them like any user
AS_A_USER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]


def as_a_user(*args: str) -> subprocess.CompletedProcess:
    prefix = AS_A_USER if os.geteuid() == 0 else []
    return subprocess.run([*prefix, ROBOTRL, *args], capture_output=True, text=True, timeout=300)


def one_line(out: subprocess.CompletedProcess) -> str:
    """The command's error: exit status 2 and exactly one line on stderr (a traceback is many)."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("os") / "reach.zarr"
    record_expert(path, "Reach", episodes=2, num_envs=2, progress=False).close()
    return path


def test_a_directory_it_may_not_write_or_read_is_one_line_naming_the_path(store: Path, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    hidden = tmp_path / "hidden.zarr"
    shutil.copytree(store, hidden)
    hidden.chmod(0o000)
    try:
        cases = {
            ("data", "record", "--task", "Reach", "--episodes", "1", "--out", f"{locked}/new.zarr"): (
                f"out: Permission denied: {locked}/new.zarr"
            ),
            ("data", "merge", "--inputs", str(store), "--out", f"{locked}/m.zarr"): (
                f"out: Permission denied: {locked}/m.zarr"
            ),
            ("data", "export", "--store", str(store), "--out", f"{locked}/lerobot"): (
                f"out: Permission denied: {locked}/lerobot"
            ),
            ("train", "bc", "--store", str(store), "--steps", "2", "--run-dir", f"{locked}/bc"): (
                f"run_dir: Permission denied: {locked}/bc"
            ),
            ("train", "bc", "--store", str(hidden), "--steps", "2", "--run-dir", f"{tmp_path}/bc"): (
                f"store: Permission denied: {hidden}/zarr.json"
            ),
        }
        for args, expected in cases.items():
            assert one_line(as_a_user(*args)).endswith(f"error: {expected}"), args
        assert list(locked.iterdir()) == []  # nothing half-made left behind, not even aside
        assert not (tmp_path / "bc" / TRAIN_STATE).exists()
    finally:
        hidden.chmod(0o755)
    assert EpisodeStore.open(hidden).num_episodes == 2


def test_a_full_disk_is_one_line_and_keeps_every_committed_episode(store: Path, tmp_path: Path) -> None:
    """A 256 KiB disk: a record appending to a 2-episode store fills it part-way, and says so in one line naming
    the store; the store then validates with every episode it committed (the first two byte for byte), and the
    next writer trims the uncommitted rows. A training run on the full disk stops at its first train state, naming
    the file, with no partial file left."""
    disk, logs = tmp_path / "disk", tmp_path / "logs"
    disk.mkdir()
    logs.mkdir()
    robotrl = shlex.quote(ROBOTRL)
    script = f"""
    set -u
    mount -t tmpfs -o size=256k tmpfs {disk} || exit 99
    cp -r {store} {disk}/reach.zarr
    {robotrl} data record --task Reach --out {disk}/reach.zarr --episodes 400 --num-envs 8 --seed 1 \
        2> {logs}/record.err; echo $? > {logs}/record.rc
    {robotrl} data validate --store {disk}/reach.zarr > {logs}/validate.out 2>&1; echo $? > {logs}/validate.rc
    cp -r {disk}/reach.zarr {logs}/after.zarr
    {robotrl} train bc --store {store} --steps 50 --eval-episodes 0 --run-dir {disk}/bc --no-progress \
        2> {logs}/bc.err; echo $? > {logs}/bc.rc
    find {disk} -name '*.partial*' > {logs}/partial.out
    """
    command = ["unshare", "--mount", "sh", "-c", script]
    if os.geteuid() != 0:
        command.insert(1, "--map-root-user")  # a user namespace lets a non-root user mount its own tmpfs
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    record = (logs / "record.err").read_text().strip().splitlines()[-1]  # after the progress bar's carriage returns
    assert (logs / "record.rc").read_text().strip() == "2"
    error = record.split("\r")[-1].strip()
    assert error.startswith(f"robotrl data record: error: out: {disk}/reach.zarr: No space left on device"), error
    assert "committed episodes are kept" in error
    assert (logs / "validate.rc").read_text().strip() == "0", (logs / "validate.out").read_text()
    after, before = EpisodeStore.open(logs / "after.zarr"), EpisodeStore.open(store)
    assert before.num_episodes < after.num_episodes < 400 and f"{after.num_episodes} committed" in error
    for i in range(before.num_episodes):
        a, b = after.episode(i).data, before.episode(i).data
        assert all((a[k] == b[k]).all() for k in b)

    assert (logs / "bc.rc").read_text().strip() == "2"
    bc = one_line(subprocess.CompletedProcess([], 2, "", (logs / "bc.err").read_text()))
    assert bc.startswith("robotrl train bc: error: ") and "No space left on device" in bc and f"{disk}/bc" in bc
    assert (logs / "partial.out").read_text() == ""  # no half-written file left on the full disk
