"""SIGKILL every operation that writes, at a random moment of its work, then check what it left.

For each operation: one uninterrupted run (the twin), then `--trials` runs killed at a time drawn uniformly over
the twin's working window: from the moment its work has begun (the first train state written, the store created,
the output's hidden sibling made) to the twin's end. After each kill:
- a store the operation writes into validates (`data validate`: spec, commit record with its checksum, chunk CRCs);
- an output made in one piece (merge, split, import, exports) is either absent or whole;
- the rerun completes: `--resume` for the commands with a train state, the same command for the rest (record
  and collect append: the rerun records the episodes still missing, with the next seed);
- and ends with the twin's result: every tensor of the run's weights and train state bit for bit (with the stores
  it records), every array of a store, every file of an export (wall-clock fields aside). Record and collect: the
  episodes committed before the kill are the twin's first episodes, array for array.

Prints one JSON line per trial and a summary line per operation; bench/RESULTS.md, "Killed at a random moment:
every operation that writes", holds its table.

    python bench/kill.py [--trials 3] [--ops record merge ...] [--work DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robotrl.training.loop import TRAIN_STATE, load_train_state

ROBOTRL = str(Path(sys.executable).parent / "robotrl")
QUIET = ["--no-progress", "--threads", "1"]


@dataclass
class Op:
    name: str
    argv: Callable[[Path, Path], list[str]]
    """the command writing its output `out`, given the shared inputs' folder"""
    kind: str
    """"store": out is one store; "stores": out is a folder of stores made together; "export": a file tree made in
    one piece; "run": a run directory with a train state (rerun with --resume); "append": a store appended to"""
    marker: str = ".{name}.partial-*"
    """a glob beside `out` (`{name}`: its name) whose first match opens the kill window: the work has begun (the
    output being built aside, the store created, the first train state written)"""


def bc_flow(store: Path, out: Path, steps: int, every: int) -> list[str]:
    return [
        *("train", "bc", "--store", str(store), "--steps", str(steps), "--batch-size", "32", "--warmup", "10"),
        *("--lr", "3e-4", "--eval-episodes", "0", "--checkpoint-every", str(every), "--run-dir", str(out), *QUIET),
        *("policy:flow", "--policy.backbone", "mlp", "--policy.mlp-width", "128", "--policy.mlp-depth", "2"),
        *("--policy.action-horizon", "8"),
    ]


FLOW_RL = ["--execute", "4", "--sampler-steps", "5", "--eval-episodes", "0"]
ONLINE = ["--num-envs", "4", "--rollout-steps", "20", "--total-steps", "800", "--checkpoint-every", "80"]
ONLINE += ["--log-every", "80", "--critic-warmup", "1", "--ema", "0.9", *FLOW_RL]

OPS = [
    Op(
        "record",
        lambda i, o: ["data", "record", "--task", "Reach", "--out", str(o), "--episodes", "80"],
        "append",
        "{name}/zarr.json",
    ),
    Op(
        "collect",
        lambda i, o: [
            "data",
            "collect",
            *("--task", "Reach", "--device", "scripted", "--out", str(o)),
            "--episodes",
            "24",
        ],
        "append",
        "{name}/zarr.json",
    ),
    Op(
        "merge",
        lambda i, o: ["data", "merge", "--inputs", str(i / "a.zarr"), str(i / "b.zarr"), "--out", str(o)],
        "store",
    ),
    Op(
        "split",
        lambda i, o: ["data", "split", "--store", str(i / "a.zarr"), "--out", f"{o}/x.zarr", f"{o}/y.zarr"],
        "stores",
        "{name}/.x.zarr.partial-*",
    ),
    Op("import", lambda i, o: ["data", "import", "--input", str(i / "lerobot"), "--out", str(o)], "store"),
    Op("data export", lambda i, o: ["data", "export", "--store", str(i / "a.zarr"), "--out", str(o)], "export"),
    Op(
        "policy export",
        lambda i, o: ["policy", "export", "--policy", str(i / "bc" / "policy"), "--out", str(o)],
        "export",
    ),
    Op("train bc", lambda i, o: bc_flow(i / "a.zarr", o, 600, 50), "run", "{name}/" + TRAIN_STATE),
    Op(
        "train sac",
        lambda i, o: [
            *("train", "sac", "--task", "Reach", "--num-envs", "2", "--total-steps", "800", "--learning-starts", "100"),
            *("--hidden", "64", "64", "--eval-episodes", "0", "--checkpoint-every", "100", "--run-dir", str(o), *QUIET),
        ],
        "run",
        "{name}/" + TRAIN_STATE,
    ),
    Op(
        "train ppo",
        lambda i, o: [
            *("train", "ppo", "--task", "Reach", "--num-envs", "8", "--rollout-steps", "16", "--total-steps", "2048"),
            *("--hidden", "32", "32", "--checkpoint-every", "128", "--eval-episodes", "0", "--run-dir", str(o), *QUIET),
        ],
        "run",
        "{name}/" + TRAIN_STATE,
    ),
    Op(
        "train online",
        lambda i, o: ["train", "online", "--policy", str(i / "bc" / "policy"), *ONLINE, "--run-dir", str(o), *QUIET],
        "run",
        "{name}/" + TRAIN_STATE,
    ),
    Op(
        "train hil",
        lambda i, o: ["train", "hil", "--policy", str(i / "bc" / "policy"), *ONLINE, "--run-dir", str(o), *QUIET],
        "run",
        "{name}/" + TRAIN_STATE,
    ),
    Op(
        "train offline",
        lambda i, o: [
            *("train", "offline", "--policy", str(i / "bc" / "policy"), "--store", str(i / "a.zarr")),
            *("--iterations", "4", "--critic-steps", "50", "--policy-updates", "2", "--windows", "16"),
            *("--minibatch-size", "32", "--epochs", "2", "--rollout-episodes", "4", "--rollout-envs", "4"),
            *(*FLOW_RL, "--run-dir", str(o), *QUIET),
        ],
        "run",
        "{name}/" + TRAIN_STATE,
    ),
    Op(
        "policy distill",
        lambda i, o: [
            *("policy", "distill", "--teacher", str(i / "bc" / "policy"), "--store", str(i / "a.zarr")),
            *("--steps", "400", "--batch-size", "32", "--warmup", "10", "--checkpoint-every", "50"),
            *("--eval-episodes", "0", "--dagger-rounds", "0", "--run-dir", str(o), *QUIET),
        ],
        "run",
        "{name}/" + TRAIN_STATE,
    ),
    Op("run", lambda i, o: ["run", "--budget", "smoke", "--run-dir", str(o), *QUIET], "run", "{name}/config.yaml"),
]


def robotrl(args: list[str], timeout: float = 1800) -> subprocess.CompletedProcess:
    done = subprocess.run([ROBOTRL, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"robotrl {' '.join(args)}: exit {done.returncode}: {done.stderr[-2000:]}")
    return done


def inputs(folder: Path) -> Path:
    """The shared inputs: two Reach stores of 40 demos, a half-trained chunk-MLP flow policy, a LeRobot export."""
    if (folder / "done").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, seed in (("a", "0"), ("b", "1")):
        robotrl(
            ["data", "record", "--task", "Reach", "--out", str(folder / f"{name}.zarr"), "--episodes", "40"]
            + ["--noise", "0.3", "--seed", seed]
        )
    robotrl(bc_flow(folder / "a.zarr", folder / "bc", 100, 100))
    robotrl(["data", "export", "--store", str(folder / "a.zarr"), "--out", str(folder / "lerobot")])
    (folder / "done").touch()
    return folder


def timed(args: list[str], started: Callable[[], bool]) -> tuple[float, float]:
    """Run `args` to its end: (seconds, seconds until its work had begun)."""
    start = time.monotonic()
    proc = subprocess.Popen([ROBOTRL, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = 0.0
    while proc.poll() is None:
        if not seen and started():
            seen = time.monotonic() - start
        time.sleep(0.002)
    if proc.returncode != 0:
        raise RuntimeError(f"robotrl {' '.join(args)}: exit {proc.returncode}: {proc.stderr.read()[-2000:]}")
    return time.monotonic() - start, seen


def killed(args: list[str], started: Callable[[], bool], at: float) -> tuple[bool, float]:
    """Run `args`, SIGKILL it `at` seconds after its work has begun; (killed, seconds since then)."""
    proc = subprocess.Popen([ROBOTRL, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not started() and proc.poll() is None:
        time.sleep(0.002)
    start = time.monotonic()
    if proc.returncode is not None:  # ended before its work was seen to begin
        return False, 0.0
    try:
        proc.wait(timeout=at)
        return False, time.monotonic() - start
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return True, time.monotonic() - start


# ---------------------------------------------------------------------------------------------------
# what a killed output must be, and the same as its twin
# ---------------------------------------------------------------------------------------------------
def store_arrays(path: Path) -> tuple[int, dict[str, np.ndarray]]:
    """A store's committed episodes and its arrays (the wall-clock timestamps aside)."""
    from robotrl.datasets import EpisodeStore

    store = EpisodeStore.open(path)
    return store.num_episodes, store.load([k for k in store.arrays_spec if k != "timestamp"])


def invalid(path: Path) -> list[str]:
    from robotrl.datasets import EpisodeStore
    from robotrl.datasets.store import validate

    return validate(EpisodeStore.open(path))


def store_difference(a: Path, b: Path) -> str | None:
    if problems := invalid(b):
        return f"{b.name} does not validate: {problems[:2]}"
    (na, xa), (nb, xb) = store_arrays(a), store_arrays(b)
    if na != nb:
        return f"{b.name}: {nb} episodes, the twin {na}"
    diff = [k for k in xa if not np.array_equal(xa[k], xb[k])]
    return f"{b.name}: arrays {diff} differ" if diff else None


def file_digests(root: Path) -> dict[str, str]:
    """Every file of an export, its manifest without the export's wall-clock seconds."""
    out = {}
    for f in sorted(root.rglob("*")):
        if f.is_file():
            data = f.read_bytes()
            if f.name == "manifest.json":
                manifest = json.loads(data)
                manifest.get("export", {}).pop("export_seconds", None)
                data = json.dumps(manifest, sort_keys=True).encode()
            out[str(f.relative_to(root))] = hashlib.sha256(data).hexdigest()
    return out


def export_difference(a: Path, b: Path) -> str | None:
    da, db = file_digests(a), file_digests(b)
    return None if da == db else f"files differ: {sorted(k for k in da.keys() | db.keys() if da.get(k) != db.get(k))}"


def tensors(root: Path) -> dict[str, Any]:
    """Every weight and train state of a run directory, flattened: "<file>.<key>..." -> tensor or number."""
    from safetensors.torch import load_file

    def flat(prefix: str, x: Any, out: dict[str, Any]) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                flat(f"{prefix}.{k}", v, out)
        elif isinstance(x, (list, tuple)):
            for k, v in enumerate(x):
                flat(f"{prefix}.{k}", v, out)
        else:
            out[prefix] = x

    out: dict[str, Any] = {}
    for f in sorted(root.rglob("*")):
        rel = str(f.relative_to(root))
        if f.name == TRAIN_STATE:
            flat(rel, load_train_state(f), out)
        elif f.suffix == ".safetensors":
            flat(rel, load_file(f), out)
        elif f.suffix == ".onnx":
            out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def run_difference(a: Path, b: Path) -> str | None:
    import torch

    ta, tb = tensors(a), tensors(b)
    if ta.keys() != tb.keys():
        return f"files or keys differ: {sorted(set(ta) ^ set(tb))[:5]}"
    for k, x in ta.items():
        if k.endswith(".timestamp"):  # the wall clock of an unfinished episode's steps
            continue
        y = tb[k]
        if isinstance(x, torch.Tensor):
            x, y = x.numpy(), y.numpy()
        x, y = np.asarray(x), np.asarray(y)
        same = x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind in "fc")  # NaN: unset state
        if not same:
            return f"{k} differs"
    for store in sorted(a.rglob("*.zarr")):  # a replay or intervention store the run records
        if diff := store_difference(store, b / store.relative_to(a)):
            return diff
    return None


def check(op: Op, shared: Path, twin: Path, out: Path) -> tuple[str, str | None]:
    """(what the kill left, the first difference from the twin once rerun, or None)."""
    args = op.argv(shared, out)
    if op.kind == "run":
        left = "a run directory"
        if (out / TRAIN_STATE).exists():
            left = f"a train state at step {load_train_state(out / TRAIN_STATE)['step']}"
        elif (out / "stages.jsonl").exists():
            left = f"{len((out / 'stages.jsonl').read_text().splitlines())} stages finished"
        robotrl([*args, "--resume"])
        return left, run_difference(twin, out)
    if op.kind == "append":
        if not out.exists():
            robotrl([*args, "--seed", "1"])
            return "nothing", None if store_arrays(out)[0] == episodes(args) else "too few episodes"
        if problems := invalid(out):
            return f"a store that does not validate: {problems[:2]}", "not rerun"
        (n, x), (_, xt) = store_arrays(out), store_arrays(twin)
        if any(not np.array_equal(x[k], xt[k][: len(x[k])]) for k in x):
            return f"{n} episodes, not the twin's first {n}", "not rerun"
        if n < episodes(args):  # the rerun records what is missing, with the next seed
            args[args.index("--episodes") + 1] = str(episodes(args) - n)
            robotrl([*args, "--seed", "1"])
        after = store_arrays(out)[0]
        total = episodes(op.argv(shared, out))
        left = f"{n} committed episodes, the twin's first {n}"
        if invalid(out):
            return left, "invalid after the rerun"
        return left, None if after == total else f"{after} episodes after the rerun, expected {total}"
    # made in one piece: nothing or the whole of it, then the same command again
    parts = [Path("x.zarr"), Path("y.zarr")] if op.kind == "stores" else [Path()]
    present = [p for p in parts if (out / p).exists() and (out / p).is_dir() and any((out / p).iterdir())]
    left = "nothing" if not present else "whole" if len(present) == len(parts) else "part of it"
    difference = export_difference if op.kind == "export" else store_difference
    for p in present:
        if diff := difference(twin / p, out / p):
            return left, f"left {diff}"
    if left != "whole":
        robotrl(args)
    for p in parts:
        if diff := difference(twin / p, out / p):
            return left, diff
    return left, None


def begun(op: Op, out: Path) -> Callable[[], bool]:
    """Whether `op`'s work into `out` has begun (its marker exists)."""
    pattern = op.marker.format(name=out.name)
    return lambda: any(out.parent.glob(pattern))


def episodes(args: list[str]) -> int:
    return int(args[args.index("--episodes") + 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--ops", nargs="*", default=[op.name for op in OPS])
    parser.add_argument("--work", type=Path, default=Path("/tmp/robotrl-kill"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    shared = inputs(args.work / "inputs")
    for op in (o for o in OPS if o.name in args.ops):
        folder = args.work / op.name.replace(" ", "-")
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        twin = folder / "twin"
        seconds, seen = timed(op.argv(shared, twin), begun(op, twin))
        window = (0.0, seconds - seen)
        results = []
        for trial in range(args.trials):
            out = folder / f"killed-{trial}"
            for _ in range(5):  # a draw past the end of the work is not a kill: draw again
                at = rng.uniform(*window)
                was_killed, ran = killed(op.argv(shared, out), begun(op, out), at)
                if was_killed:
                    break
                shutil.rmtree(out, ignore_errors=True)
            if not was_killed:
                print(json.dumps({"op": op.name, "trial": trial, "killed": False}), flush=True)
                continue
            left, diff = check(op, shared, twin, out)
            row = {
                "op": op.name,
                "trial": trial,
                "killed_at_s": round(ran, 2),
                "window_s": [round(w, 2) for w in window],
                "left": left,
                "same_as_twin": diff is None,
                "difference": diff,
            }
            results.append(row)
            print(json.dumps(row), flush=True)
        ok = sum(r["same_as_twin"] for r in results)
        print(
            json.dumps({"op": op.name, "twin_s": round(seconds, 1), "trials": len(results), "same_as_twin": ok}),
            flush=True,
        )


if __name__ == "__main__":
    main()
