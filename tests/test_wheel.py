"""robotrl as a user installs it: a wheel built from the repository, installed into a fresh venv outside the
checkout, run from a directory outside it. Nothing may reach into the source tree: the env benchmark, the
pipeline, and the deploy node with a launch parameter file that ships in the wheel.

The fresh venv gets the dependencies without installing them again: a .pth line adds this venv's site-packages to
its path (a plain path line: that directory's own .pth files are not run, so the editable install's finder, which
would import robotrl from the checkout, stays off), and the other .pth files there (ROS wheels' bootstrap,
setuptools' distutils shim) are copied beside it. robotrl itself comes only from the wheel (`--no-deps`).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: what the repository holds that is not part of a source distribution
NOT_SOURCE = (".venv", ".git", "runs", "data", "build", "__pycache__", "*.egg-info", ".pytest_cache", ".whl", ".gl")


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)} -> {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    """(the fresh venv's bin/, the environment its commands run in, a working directory outside the checkout)."""
    root = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    # the wheel, built from a copy of the repository (a build writes build/ and *.egg-info where it runs)
    source = root / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(root / "dist"),
            str(source),
        ],
        root,
        env,
        600,
    )
    wheel = next((root / "dist").glob("robotrl-*.whl"))
    # a venv outside the checkout whose path reaches this venv's dependencies
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], root, env, 120)
    fresh = Path(
        run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            root,
            env,
            60,
        ).stdout.strip()
    )
    deps = Path(site.getsitepackages()[0])
    (fresh / "00-robotrl-deps.pth").write_text(f"{deps}\n")
    for pth in deps.glob("*.pth"):
        if not pth.name.startswith("__editable__"):
            shutil.copy(pth, fresh / pth.name)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            str(wheel),
        ],
        root,
        env,
        300,
    )
    work = root / "work"
    work.mkdir()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv / "bin", env, work


def test_robotrl_comes_from_the_wheel(installed: tuple[Path, dict[str, str], Path]) -> None:
    bin_dir, env, work = installed
    out = run(
        [
            str(bin_dir / "python"),
            "-c",
            "import robotrl.envs, robotrl.launch, robotrl.hardware.nodes as n; "
            "print(robotrl.envs.__file__); print(n.NODES['deploy'].params_file)",
        ],
        work,
        env,
        120,
    )
    module, params = map(Path, out.stdout.split())
    venv = bin_dir.parent
    assert venv in module.parents and venv in params.parents and params.is_file(), out.stdout
    assert not any(ROOT in p.parents for p in (module, params))


def test_envs_bench_runs_from_the_wheel(installed: tuple[Path, dict[str, str], Path]) -> None:
    bin_dir, env, work = installed
    out = run([str(bin_dir / "robotrl"), "envs", "bench", "--seconds", "1"], work, env, 600)
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert records and all(r["task"] == "PushT" and r["cpu_steps_per_s"] > 0 for r in records), out.stdout


def test_deploy_starts_with_a_shipped_parameter_file(installed: tuple[Path, dict[str, str], Path]) -> None:
    """A policy made by the wheel's own commands (demos, BC, export), then `robotrl-deploy` started as its launch
    file starts it: the parameter file from the installed package; it comes up and stops cleanly on SIGTERM."""
    bin_dir, env, work = installed
    robotrl = str(bin_dir / "robotrl")
    run(
        [
            robotrl,
            "data",
            "record",
            "--task",
            "PushT",
            "--out",
            "demos.zarr",
            "--episodes",
            "2",
            "--num-envs",
            "2",
            "--episode-steps",
            "20",
        ],
        work,
        env,
        300,
    )
    run(
        [
            robotrl,
            "train",
            "bc",
            "--store",
            "demos.zarr",
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--warmup",
            "1",
            "--eval-episodes",
            "0",
            "--run-dir",
            "bc",
            "--no-progress",
            "--threads",
            "1",
            "policy:flow",
            "--policy.channels",
            "8",
            "16",
            "--policy.action-horizon",
            "8",
            "--policy.steps",
            "2",
        ],
        work,
        env,
        300,
    )
    run([robotrl, "policy", "export", "--policy", "bc/policy", "--out", "export"], work, env, 300)
    script = textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from robotrl.hardware import nodes

        params = nodes.NODES["deploy"].params_file
        assert Path(sys.prefix) in params.parents, params  # the wheel's own file
        procs = nodes.start({"deploy": {"policy": str(Path("export").resolve())}}, Path("."))
        log, end = Path("deploy.log"), time.monotonic() + 90
        while "deploying" not in (log.read_text() if log.exists() else "") and time.monotonic() < end:
            assert procs["deploy"].poll() is None, log.read_text()
            time.sleep(0.2)
        assert "deploying" in log.read_text(), log.read_text()
        nodes.stop(procs)
        assert procs["deploy"].returncode == 0, (procs["deploy"].returncode, log.read_text())
        print(params)
    """)
    out = run([str(bin_dir / "python"), "-c", script], work, env, 180)
    assert out.stdout.strip().endswith("deploy.yaml")


@pytest.mark.slow
def test_run_smoke_from_the_wheel(installed: tuple[Path, dict[str, str], Path]) -> None:
    """`robotrl run --budget smoke` from the wheel: every stage, its table and the exported policy."""
    bin_dir, env, work = installed
    out = run(
        [
            str(bin_dir / "robotrl"),
            "run",
            "--budget",
            "smoke",
            "--run-dir",
            "pipeline",
            "--no-progress",
            "--threads",
            "1",
        ],
        work,
        env,
        900,
    )
    assert "| export |" in out.stdout, out.stdout
    assert (work / "pipeline" / "export" / "manifest.json").is_file()
