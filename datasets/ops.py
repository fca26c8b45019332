"""Whole-store operations behind `robotrl data`: info, validate, stats, merge, split.

Each command is a dataclass config (the CLI and the Python API) and a function; none modifies its inputs,
so a mistake never costs recorded data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from robotrl.core.files import made_aside
from robotrl.datasets.store import EpisodeStore, StoreError, user_meta, validate


@dataclass
class DataInfo:
    """Summarize a store: task, episodes, steps, lengths, success rate, sources, instructions, keys."""

    store: Path
    json: bool = False
    """print the summary as one JSON object"""


@dataclass
class DataValidate:
    """Check a store: its spec (optionally against a task's), the commit record and the checksum of every chunk."""

    store: Path
    task: str | None = None
    """also check the store's spec against this task's (with the task's default options)"""


@dataclass
class DataStats:
    """Per-key normalization statistics (mean, std, min, max) stored with the data."""

    store: Path
    json: bool = False


@dataclass
class DataMerge:
    """Concatenate stores with the same spec into a new store (episodes in the order given)."""

    inputs: list[Path]
    out: Path


@dataclass
class DataSplit:
    """Split a store's episodes at random into two new stores (e.g. train / held-out validation)."""

    store: Path
    out: list[Path] = field(default_factory=list)
    """two output paths (default: <store>_train.zarr and <store>_val.zarr next to the input)"""
    fraction: float = 0.9
    """share of episodes that go to the first output"""
    seed: int = 0


@dataclass
class DataExport:
    """Convert a store to a LeRobot v3.0 dataset (parquet + mp4 + meta/) or a ROS 2 MCAP recording."""

    store: Path
    out: Path
    """LeRobot: a new directory; MCAP: a .mcap file"""
    format: Literal["lerobot", "mcap"] = "lerobot"
    episodes: list[int] | None = None
    """MCAP only: which episodes, in order (default: all)"""
    video: bool = True
    """LeRobot only: cameras as lossless mp4 (else PNG frames inside the parquet)"""
    repo_id: str | None = None
    """LeRobot only: dataset name in info.json (default robotrl/<task>)"""


@dataclass
class DataImport:
    """Convert a LeRobot v3 dataset or a ROS 2 MCAP recording into a store (resampled to the control rate)."""

    input: Path
    out: Path
    format: Literal["lerobot", "mcap"] = "lerobot"
    task: str | None = None
    """the task whose spec the data must match (default: the spec saved in the input by robotrl, or for a
    foreign LeRobot dataset one built from its features)"""
    control_hz: float | None = None
    """MCAP only: resampling rate (default: the spec's)"""


def info(config: DataInfo) -> dict[str, Any]:
    summary = EpisodeStore.open(config.store).summary()
    if config.json:
        print(json.dumps(summary))
    else:
        ln = summary["length"]
        print(
            f"{summary['path']}: task {summary['task']}, {summary['episodes']} episodes, {summary['steps']} steps "
            f"({summary['control_hz']:g} Hz); length {ln['min']}/{ln['mean']:.1f}/{ln['max']} (min/mean/max); "
            f"success {summary['success_rate']:.1%}; sources {summary['sources']}"
        )
        for instruction in summary["instructions"]:
            print(f"  instruction: {instruction}")
        for key, k in summary["keys"].items():
            print(f"  {key:<14} {k['dtype']:<8} {tuple(k['shape'])}  chunk {k['chunk_rows']} rows")
    return summary


def check(config: DataValidate) -> list[str]:
    spec = None
    if config.task is not None:
        from robotrl.envs import spec_of

        spec = spec_of(config.task)
    errors = validate(EpisodeStore.open(config.store), spec)
    for e in errors:
        print(f"error: {e}")
    if errors:
        raise SystemExit(f"{config.store}: {len(errors)} problem(s)")
    print(f"{config.store}: ok")
    return errors


def stats(config: DataStats) -> dict[str, dict[str, list[float]]]:
    st = EpisodeStore.open(config.store).stats()
    out = {k: {name: np.asarray(v).tolist() for name, v in s.items()} for k, s in st.items()}
    if config.json:
        print(json.dumps(out))
    else:
        with np.printoptions(precision=3, suppress=True, linewidth=160):
            for key, s in st.items():
                print(f"{key} (n={int(s['count'])})")
                for name in ("mean", "std", "min", "max"):
                    print(f"  {name:<4} {np.asarray(s[name])}")
    return out


def copy_episodes(src: EpisodeStore, dst: EpisodeStore, episodes: list[int] | None = None) -> int:
    """Append `episodes` of `src` (default: all) to `dst`, metadata kept (with the source store recorded)."""
    count = 0
    for i in range(src.num_episodes) if episodes is None else episodes:
        ep = src.episode(i)
        meta = user_meta(ep.meta)
        meta.setdefault("origin", {"store": src.path.name, "episode": i})
        dst.append_episode(ep.data, meta)
        count += 1
    return count


def merge(config: DataMerge) -> EpisodeStore:
    if not config.inputs:
        raise ValueError("merge.inputs: expected at least one store, got none")
    sources = [EpisodeStore.open(p) for p in config.inputs]
    for s in sources[1:]:
        s.spec.check(sources[0].spec, this=f"store {s.path}", that=f"store {sources[0].path}")
    # built aside: a killed merge leaves no store that looks whole
    with made_aside(config.out, "a store") as aside, EpisodeStore.create(aside, sources[0].spec) as building:
        for s in sources:
            copy_episodes(s, building)
    out = EpisodeStore.open(config.out)
    print(f"{config.out}: {out.num_episodes} episodes, {out.num_steps} steps from {len(sources)} store(s)")
    return out


def split(config: DataSplit) -> tuple[EpisodeStore, EpisodeStore]:
    if not 0.0 < config.fraction < 1.0:
        raise ValueError(f"split.fraction: expected a value in (0, 1), got {config.fraction}")
    src = EpisodeStore.open(config.store)
    if src.num_episodes < 2:
        raise StoreError(f"split: {config.store} has {src.num_episodes} episode(s); need at least 2")
    stem = config.store.with_suffix("")
    outs = config.out or [Path(f"{stem}_train.zarr"), Path(f"{stem}_val.zarr")]
    if len(outs) != 2:
        raise ValueError(f"split.out: expected two paths, got {len(outs)}")
    order = np.random.default_rng(config.seed).permutation(src.num_episodes)
    n_first = min(src.num_episodes - 1, max(1, round(config.fraction * src.num_episodes)))
    parts = (sorted(order[:n_first].tolist()), sorted(order[n_first:].tolist()))
    stores = []
    with made_aside(outs[0], "a store") as first, made_aside(outs[1], "a store") as second:  # both whole, or neither
        for path, eps in zip((first, second), parts):
            with EpisodeStore.create(path, src.spec) as dst:
                copy_episodes(src, dst, eps)
    for path in outs:
        stores.append(EpisodeStore.open(path))
        print(f"{path}: {stores[-1].num_episodes} episodes, {stores[-1].num_steps} steps")
    return stores[0], stores[1]


def export(config: DataExport) -> Path:
    if config.format == "lerobot":
        from robotrl.datasets.lerobot import export_lerobot

        out = export_lerobot(config.store, config.out, video=config.video, repo_id=config.repo_id)
    else:
        from robotrl.datasets.mcap import export_mcap

        out = export_mcap(config.store, config.out, episodes=config.episodes)
    print(f"{out}: {config.format} export of {config.store}")
    return out


def import_(config: DataImport) -> EpisodeStore:
    spec = None
    if config.task is not None:
        from robotrl.envs import spec_of

        spec = spec_of(config.task)
    if config.format == "lerobot":
        from robotrl.datasets.lerobot import import_lerobot

        with made_aside(config.out, "a store") as aside:
            import_lerobot(config.input, aside, spec=spec).close()
    else:
        from robotrl.datasets.mcap import embedded_spec, import_mcap

        saved = embedded_spec(config.input)
        if spec is not None and saved is not None:
            saved.check(spec, this=f"recording {config.input.name}", that=f"task {config.task}")
        spec = spec or saved
        if spec is None:
            raise ValueError(
                f"task: {config.input} carries no robotrl spec; expected --task naming the task it records"
            )
        with made_aside(config.out, "a store") as aside:  # a killed import leaves no store that looks whole
            import_mcap(config.input, aside, spec, control_hz=config.control_hz).close()
    store = EpisodeStore.open(config.out)
    print(f"{config.out}: {store.num_episodes} episodes, {store.num_steps} steps imported from {config.input}")
    return store
