"""LeRobot v3.0 export / import: exact round trips, the documented v3 layout, foreign datasets, bad input."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from robotrl import ArraySpec, Spec, SpecMismatchError
from robotrl.datasets import EpisodeStore
from robotrl.datasets.lerobot import LeRobotFormatError, export_lerobot, import_lerobot
from robotrl.datasets.record import record_expert

SPEC = Spec(
    task="Synthetic",
    observations={
        "state": ArraySpec((6,), "float32", fields=(("pos", 3), ("vel", 3))),
        "force": ArraySpec((), "float32"),
        "contact": ArraySpec((2, 3), "float32"),
        "image_front": ArraySpec((24, 24, 3), "uint8", 0, 255),
        "instruction": ArraySpec((), "str"),
    },
    action=ArraySpec((2,), "float32", -1.0, 1.0),
    action_mode="ee_delta",
    control_hz=10.0,
)
LENGTHS = (7, 30, 1, 18)  # a one-step episode too
INSTRUCTIONS = ("push the block", None, "push the block", "stack the cubes")
V3_INFO_KEYS = (
    "codebase_version",
    "robot_type",
    "total_episodes",
    "total_frames",
    "total_tasks",
    "chunks_size",
    "data_files_size_in_mb",
    "video_files_size_in_mb",
    "fps",
    "splits",
    "data_path",
    "video_path",
    "features",
)
EPISODE_COLUMNS = (
    "episode_index",
    "tasks",
    "length",
    "data/chunk_index",
    "data/file_index",
    "dataset_from_index",
    "dataset_to_index",
    "meta/episodes/chunk_index",
    "meta/episodes/file_index",
)
DEFAULT_FEATURES = {
    "timestamp": "float32",
    "frame_index": "int64",
    "episode_index": "int64",
    "index": "int64",
    "task_index": "int64",
}


def synthetic_episode(k: int) -> dict[str, np.ndarray]:
    """Random contents (the worst case for a video codec) with every step flag exercised."""
    rng = np.random.default_rng(k)
    n = LENGTHS[k]
    t = np.arange(n)
    return {
        "state": rng.normal(size=(n, 6)).astype(np.float32),
        "force": rng.normal(size=n).astype(np.float32),
        "contact": rng.normal(size=(n, 2, 3)).astype(np.float32),
        "image_front": rng.integers(0, 256, (n, 24, 24, 3), dtype=np.uint8),
        "action": rng.uniform(-1, 1, (n, 2)).astype(np.float32),
        "reward": rng.normal(size=n).astype(np.float32),
        "terminated": t == n - 1,
        "truncated": (t == n - 1) & (k % 2 == 1),  # both at once in odd episodes
        "success": (t == n - 1) & (k != 1),
        "intervention": t % 3 == 1,
        "timestamp": 1.7e9 + k * 100 + t * 0.1,
    }


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> EpisodeStore:
    store = EpisodeStore.create(tmp_path_factory.mktemp("syn") / "syn.zarr", SPEC)
    for k in range(len(LENGTHS)):
        store.append_episode(
            synthetic_episode(k),
            {
                "instruction": INSTRUCTIONS[k],
                "success": k != 1,
                "source": "teleop",
                "robot": "sim",
                "k": k,
                "notes": {"a": [1, k]},
            },
        )
    return store


@pytest.fixture(scope="module")
def pickplace(tmp_path_factory: pytest.TempPathFactory) -> EpisodeStore:
    """Real scripted-expert demonstrations: state, two 64x64 cameras, language instructions."""
    return record_expert(
        tmp_path_factory.mktemp("pp") / "pp.zarr", "PickPlace", episodes=3, num_envs=3, episode_steps=25, progress=False
    )


@pytest.fixture(scope="module")
def pickplace_v3(pickplace: EpisodeStore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The PickPlace store exported once (read-only; tests that alter it work on a copy)."""
    return export_lerobot(pickplace, tmp_path_factory.mktemp("ppv3") / "pickplace", progress=False)


def assert_same_store(a: EpisodeStore, b: EpisodeStore) -> None:
    assert b.spec == a.spec
    np.testing.assert_array_equal(b.episode_ends, a.episode_ends)
    for i in range(a.num_episodes):
        x, y = a.episode(i), b.episode(i)
        assert set(y.data) == set(x.data)
        for key in x.data:
            assert y.data[key].dtype == x.data[key].dtype, key
            np.testing.assert_array_equal(y.data[key], x.data[key], err_msg=f"episode {i} key {key}")
        assert y.meta == x.meta


def read_table(path: Path) -> pa.Table:
    return pq.read_table(path)


def check_v3(root: Path) -> dict:
    """Everything the LeRobot v3.0 layout promises, checked on the files alone (no robotrl code)."""
    info = json.loads((root / "meta/info.json").read_text())
    assert [k for k in V3_INFO_KEYS if k not in info] == []
    assert info["codebase_version"] == "v3.0"
    fps = info["fps"]
    assert isinstance(fps, int) and fps > 0
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    feats = info["features"]
    video_keys = [k for k, f in feats.items() if f["dtype"] == "video"]
    assert info["video_path"] == (
        "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4" if video_keys else None
    )
    for name, ft in feats.items():
        assert "/" not in name and {"dtype", "shape", "names"} <= set(ft), name
        assert all(isinstance(s, int) and s > 0 for s in ft["shape"]), name
        if ft["dtype"] in ("video", "image"):
            assert ft["names"] == ["height", "width", "channels"] and ft["shape"][2] == 3
        if ft["dtype"] == "video":
            vi = ft["info"]
            assert (vi["video.fps"], vi["video.height"], vi["video.width"], vi["video.channels"]) == (
                fps,
                ft["shape"][0],
                ft["shape"][1],
                3,
            )
        if isinstance(ft["names"], list) and ft["dtype"] not in ("video", "image"):
            assert len(ft["names"]) == ft["shape"][0], name
    for name, dtype in DEFAULT_FEATURES.items():
        assert feats[name] == {"dtype": dtype, "shape": [1], "names": None}
    assert info["splits"] == {"train": f"0:{info['total_episodes']}"}

    # frames: every non-video feature is a column of the declared type, and nothing else
    data_files = sorted((root / "data").glob("*/*.parquet"))
    assert all(re.fullmatch(r"data/chunk-\d{3}/file-\d{3}\.parquet", str(f.relative_to(root))) for f in data_files)
    data = pa.concat_tables([read_table(f) for f in data_files])
    assert set(data.column_names) == {k for k, f in feats.items() if f["dtype"] != "video"}
    for name in data.column_names:
        ft, typ = feats[name], data.schema.field(name).type
        if ft["dtype"] == "image":
            assert pa.types.is_struct(typ) and {typ.field(i).name for i in range(typ.num_fields)} == {"bytes", "path"}
        elif ft["shape"] == [1]:
            assert typ == pa.from_numpy_dtype(np.dtype(ft["dtype"])), name
        else:
            for n in ft["shape"]:
                assert pa.types.is_fixed_size_list(typ) and typ.list_size == n, name
                typ = typ.value_type
            assert typ == pa.from_numpy_dtype(np.dtype(ft["dtype"])), name
    assert data.num_rows == info["total_frames"]
    np.testing.assert_array_equal(data["index"].to_numpy(), np.arange(info["total_frames"]))

    tasks = read_table(root / "meta/tasks.parquet")
    task_of = dict(zip(tasks["task_index"].to_pylist(), tasks["__index_level_0__"].to_pylist()))
    assert sorted(task_of) == list(range(info["total_tasks"])) and len(set(task_of.values())) == len(task_of)

    # episodes: contiguous index ranges that match the frames, the lengths and (for videos) the timestamps
    eps = pa.concat_tables([read_table(f) for f in sorted((root / "meta/episodes").glob("*/*.parquet"))])
    video_cols = [
        f"videos/{k}/{c}" for k in video_keys for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
    ]
    assert [c for c in (*EPISODE_COLUMNS, *video_cols) if c not in eps.column_names] == []
    for name in feats:
        for stat in ("min", "max", "mean", "std", "count"):
            assert f"stats/{name}/{stat}" in eps.column_names
    rows = eps.to_pylist()
    assert [r["episode_index"] for r in rows] == list(range(info["total_episodes"]))
    assert sum(r["length"] for r in rows) == info["total_frames"]
    start = 0
    for r in rows:
        assert (r["dataset_from_index"], r["dataset_to_index"]) == (start, start + r["length"])
        start += r["length"]
        path = root / info["data_path"].format(chunk_index=r["data/chunk_index"], file_index=r["data/file_index"])
        t = read_table(path)
        t = t.filter(pc.equal(t["episode_index"], r["episode_index"]))
        np.testing.assert_array_equal(t["index"].to_numpy(), np.arange(r["dataset_from_index"], r["dataset_to_index"]))
        np.testing.assert_array_equal(t["frame_index"].to_numpy(), np.arange(r["length"]))
        np.testing.assert_allclose(t["timestamp"].to_numpy(), np.arange(r["length"]) / fps, atol=1e-6)
        assert {task_of[i] for i in t["task_index"].to_pylist()} == set(r["tasks"])
        for k in video_keys:
            p = f"videos/{k}/"
            assert r[p + "to_timestamp"] - r[p + "from_timestamp"] == pytest.approx(r["length"] / fps)

    stats = json.loads((root / "meta/stats.json").read_text())
    assert set(stats) == set(feats)
    for name, st in stats.items():
        assert {"min", "max", "mean", "std", "count", "q01", "q50", "q99"} <= set(st), name
        if feats[name]["dtype"] in ("video", "image"):
            assert np.shape(st["mean"]) == (3, 1, 1) and 0 <= np.min(st["min"]) <= np.max(st["max"]) <= 1
        else:
            assert st["count"] == [info["total_frames"]] and np.shape(st["mean"]) == tuple(feats[name]["shape"])

    # videos: each file decodes at fps, frame k at k / fps, and holds exactly its episodes' frames
    for k in video_keys:
        files = sorted((root / "videos" / k).glob("*/*.mp4"))
        times = {}
        for f in files:
            with av.open(str(f)) as c:
                s = c.streams.video[0]
                assert s.base_rate == fps and (s.height, s.width) == tuple(feats[k]["shape"][:2])
                times[f] = np.array([float(fr.time) for fr in c.decode(s)])
            np.testing.assert_allclose(times[f], np.arange(len(times[f])) / fps, atol=1e-4)
        assert sum(len(t) for t in times.values()) == info["total_frames"]
        for r in rows:
            f = root / info["video_path"].format(
                video_key=k, chunk_index=r[f"videos/{k}/chunk_index"], file_index=r[f"videos/{k}/file_index"]
            )
            t = times[f]
            inside = (t >= r[f"videos/{k}/from_timestamp"] - 1e-4) & (t < r[f"videos/{k}/to_timestamp"] - 1e-4)
            assert inside.sum() == r["length"], (k, r["episode_index"])
    return info


# ---------------------------------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------------------------------
def test_pickplace_round_trip_is_exact(pickplace: EpisodeStore, pickplace_v3: Path, tmp_path: Path) -> None:
    info = check_v3(pickplace_v3)
    assert info["robotrl_spec"] == pickplace.spec.to_dict()
    assert {k for k, f in info["features"].items() if f["dtype"] == "video"} == {
        "observation.images.front",
        "observation.images.wrist",
    }
    assert info["features"]["observation.state"]["names"][:2] == ["joint_pos_0", "joint_pos_1"]
    tasks = read_table(pickplace_v3 / "meta/tasks.parquet")["__index_level_0__"].to_pylist()
    assert set(tasks) == {e["instruction"] for e in pickplace.episodes}

    back = import_lerobot(pickplace_v3, tmp_path / "back.zarr", progress=False)
    assert_same_store(pickplace, back)  # lossless video: images too are bit-exact


@pytest.mark.parametrize("video", [True, False], ids=["mp4", "png-in-parquet"])
def test_synthetic_round_trip_across_many_files(synthetic: EpisodeStore, tmp_path: Path, video: bool) -> None:
    """Odd shapes (scalar, 2-D), a one-step episode, both end flags at once, random pixels, an episode without
    instruction, and size limits small enough that the data and videos roll over to new files."""
    out = export_lerobot(
        synthetic,
        tmp_path / "syn",
        video=video,
        data_files_size_in_mb=1e-4,
        video_files_size_in_mb=1e-4,
        progress=False,
    )
    info = check_v3(out)
    assert len(list((out / "data").glob("*/*.parquet"))) == len(LENGTHS)
    if video:
        assert len(list((out / "videos/observation.images.front").glob("*/*.mp4"))) >= 2
    else:
        assert info["features"]["observation.images.front"]["dtype"] == "image" and not (out / "videos").exists()
    assert info["features"]["observation.force"]["shape"] == [1]
    assert info["features"]["observation.contact"]["shape"] == [2, 3]
    assert info["features"]["observation.state"]["names"] == ["pos_0", "pos_1", "pos_2", "vel_0", "vel_1", "vel_2"]
    eps = read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [r["tasks"] for r in eps] == [[i or "Synthetic"] for i in INSTRUCTIONS]
    done = pa.concat_tables([read_table(f) for f in sorted((out / "data").glob("*/*.parquet"))])["next.done"]
    assert done.to_pylist() == [t == n - 1 for n in LENGTHS for t in range(n)]

    assert_same_store(synthetic, import_lerobot(out, tmp_path / "back.zarr", progress=False))


def test_pusht_state_only_round_trip(tmp_path: Path) -> None:
    store = record_expert(tmp_path / "pusht.zarr", "PushT", episodes=2, num_envs=2, episode_steps=20, progress=False)
    out = export_lerobot(store, tmp_path / "pusht", repo_id="me/pusht", progress=False)
    info = check_v3(out)
    assert info["video_path"] is None and not (out / "videos").exists() and info["repo_id"] == "me/pusht"
    assert read_table(out / "meta/tasks.parquet")["__index_level_0__"].to_pylist() == ["PushT"]  # no instruction
    assert_same_store(store, import_lerobot(out, tmp_path / "back.zarr", progress=False))


def test_lossy_codec_stays_within_stated_tolerance(pickplace: EpisodeStore, tmp_path: Path) -> None:
    """libx264 in yuv420p (LeRobot-style, ~10x smaller): pixels within a mean error of 6/255, vectors exact."""
    out = export_lerobot(pickplace, tmp_path / "lossy", vcodec="libx264", progress=False)
    back = import_lerobot(out, tmp_path / "back.zarr", progress=False)
    want, got = pickplace.load(), back.load()
    for key in ("image_front", "image_wrist"):
        assert np.abs(got[key].astype(int) - want[key]).mean() < 6.0, key
    for key in ("state", "action", "reward", "success"):
        np.testing.assert_array_equal(got[key], want[key])


# ---------------------------------------------------------------------------------------------------
# a dataset LeRobot made (no robotrl_spec): the spec comes from the features
# ---------------------------------------------------------------------------------------------------
def make_foreign(src: Path, dst: Path) -> Path:
    """`src` with everything robotrl adds taken away, and the front camera described channels-first."""
    shutil.copytree(src, dst)
    info_path = dst / "meta/info.json"
    info = json.loads(info_path.read_text())
    for key in ("robotrl_spec", "repo_id"):
        info.pop(key)
    drop = ["next.terminated", "next.truncated", "complementary_info.is_intervention", "complementary_info.wall_time"]
    for key in drop:
        info["features"].pop(key)
    info["features"]["observation.images.front"].update(shape=[3, 64, 64], names=["channels", "height", "width"])
    info_path.write_text(json.dumps(info))
    for f in (dst / "data").glob("*/*.parquet"):
        pq.write_table(read_table(f).drop_columns(drop).replace_schema_metadata(None), f)
    for f in (dst / "meta/episodes").glob("*/*.parquet"):
        t = read_table(f)
        pq.write_table(
            t.drop_columns(
                [c for c in t.column_names if c == "robotrl/meta" or any(c.startswith(f"stats/{k}/") for k in drop)]
            ),
            f,
        )
    return dst


def test_foreign_dataset_gets_a_spec_from_its_features(
    pickplace: EpisodeStore, pickplace_v3: Path, tmp_path: Path
) -> None:
    src = make_foreign(pickplace_v3, tmp_path / "so100_pick")
    store = import_lerobot(src, tmp_path / "imported.zarr", progress=False)
    spec = store.spec
    assert spec.task == "so100_pick" and spec.control_hz == 20.0 and spec.action_mode == "unknown"
    assert set(spec.observations) == {"state", "image_front", "image_wrist", "instruction"}
    assert spec.observations["image_front"].shape == (64, 64, 3)  # channels-first description, HWC data
    assert spec.observations["state"].shape == (50,) and spec.observations["state"].fields[0] == ("joint_pos_0", 1)
    stats = json.loads((src / "meta/stats.json").read_text())["action"]
    np.testing.assert_allclose(spec.action.low_array(), stats["min"])
    np.testing.assert_allclose(spec.action.high_array(), stats["max"])

    np.testing.assert_array_equal(store.episode_ends, pickplace.episode_ends)
    for i in range(pickplace.num_episodes):
        x, y = pickplace.episode(i), store.episode(i)
        for key in ("state", "image_front", "image_wrist", "action", "reward", "success"):
            np.testing.assert_array_equal(y.data[key], x.data[key], err_msg=key)
        np.testing.assert_array_equal(y.data["terminated"], x.data["terminated"] | x.data["truncated"])  # next.done
        assert not y.data["truncated"].any() and not y.data["intervention"].any()
        np.testing.assert_allclose(y.data["timestamp"], np.arange(len(x)) / 20.0, atol=1e-6)  # episode time
        assert y.meta["instruction"] == x.meta["instruction"] and y.meta["success"] == x.meta["success"]
        assert y.meta["source"] == "imported" and y.meta["origin"]["episode"] == i
    again = import_lerobot(src, tmp_path / "again.zarr", spec=spec, progress=False)  # a spec given for it
    assert again.spec == spec and again.num_steps == pickplace.num_steps


# ---------------------------------------------------------------------------------------------------
# bad input: clear errors that name the file or field, what was expected and what was found
# ---------------------------------------------------------------------------------------------------
def test_not_a_lerobot_v3_dataset(pickplace: EpisodeStore, pickplace_v3: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        LeRobotFormatError, match=r"empty/meta/info\.json: expected .*meta/info\.json, got no such file"
    ):
        import_lerobot(tmp_path / "empty", tmp_path / "a.zarr")
    with pytest.raises(LeRobotFormatError, match="robotrl zarr store"):
        import_lerobot(pickplace.path, tmp_path / "b.zarr")

    old = tmp_path / "old"
    shutil.copytree(pickplace_v3, old)
    info = json.loads((old / "meta/info.json").read_text())
    (old / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v2.1"}))
    with pytest.raises(
        LeRobotFormatError, match=r"info\.json: field 'codebase_version': expected 'v3\.0', got 'v2\.1'"
    ):
        import_lerobot(old, tmp_path / "c.zarr")
    (old / "meta/info.json").write_text(json.dumps({k: v for k, v in info.items() if k != "fps"}))
    with pytest.raises(LeRobotFormatError, match=r"missing field\(s\) \['fps'\]"):
        import_lerobot(old, tmp_path / "d.zarr")


def test_inconsistent_files_are_named(pickplace_v3: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(pickplace_v3, bad)
    data = bad / "data/chunk-000/file-000.parquet"
    pq.write_table(read_table(data).drop_columns(["action"]), data)
    with pytest.raises(LeRobotFormatError, match=r"file-000\.parquet: missing column 'action'"):
        import_lerobot(bad, tmp_path / "a.zarr", progress=False)

    shutil.rmtree(bad)
    shutil.copytree(pickplace_v3, bad)
    eps_path = bad / "meta/episodes/chunk-000/file-000.parquet"
    eps = read_table(eps_path)
    col = "videos/observation.images.front/from_timestamp"
    shifted = pc.add(eps[col], pa.array([0.0, 0.0, 0.5]))  # the last episode now runs past the end of the video
    pq.write_table(eps.set_column(eps.column_names.index(col), col, shifted), eps_path)
    with pytest.raises(
        LeRobotFormatError,
        match=r"observation\.images\.front/chunk-000/file-000\.mp4: episode 2: "
        r"expected 25 frames from 3\.0000 s \(its length\), got 15",
    ):
        import_lerobot(bad, tmp_path / "b.zarr", progress=False)
    assert not (tmp_path / "a.zarr").exists() and not (tmp_path / "b.zarr").exists()  # no half-imported store


def test_spec_and_export_arguments_are_checked(pickplace: EpisodeStore, pickplace_v3: Path, tmp_path: Path) -> None:
    other = Spec.from_dict({**pickplace.spec.to_dict(), "control_hz": 10.0})
    with pytest.raises(SpecMismatchError, match=r"spec\.control_hz: given spec has 10\.0, .*robotrl_spec has 20\.0"):
        import_lerobot(pickplace_v3, tmp_path / "a.zarr", spec=other)
    with pytest.raises(FileExistsError, match="not an empty directory"):
        export_lerobot(pickplace, pickplace_v3)
    with pytest.raises(ValueError, match=r"fps: LeRobot v3\.0 needs a positive integer frame rate, got 12\.5"):
        export_lerobot(pickplace, tmp_path / "x", fps=12.5)
    with pytest.raises(ValueError, match="vcodec: expected one of"):
        export_lerobot(pickplace, tmp_path / "y", vcodec="mjpeg")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_odd_sized_camera_is_exact_lossless_and_refused_in_yuv420p(tmp_path: Path) -> None:
    spec = Spec(
        task="Odd",
        observations={"image_top": ArraySpec((25, 33, 3), "uint8", 0, 255)},
        action=ArraySpec((1,), "float32", -1.0, 1.0),
        action_mode="joint_pos",
        control_hz=5.0,
    )
    store = EpisodeStore.create(tmp_path / "odd.zarr", spec)
    n = 6
    rng = np.random.default_rng(0)
    store.append_episode(
        {
            "image_top": rng.integers(0, 256, (n, 25, 33, 3), dtype=np.uint8),
            "action": np.zeros((n, 1), np.float32),
            "reward": np.zeros(n, np.float32),
            "terminated": np.zeros(n, bool),
            "truncated": np.arange(n) == n - 1,
            "success": np.zeros(n, bool),
            "intervention": np.zeros(n, bool),
            "timestamp": np.arange(n, dtype=np.float64),
        },
        {"instruction": None, "success": False},
    )
    with pytest.raises(
        ValueError,
        match=r"vcodec: 'libx264' encodes yuv420p, which needs an even height and width; "
        r"'image_top' is \(25, 33, 3\)",
    ):
        export_lerobot(store, tmp_path / "lossy", vcodec="libx264", progress=False)
    out = export_lerobot(store, tmp_path / "odd", progress=False)
    check_v3(out)
    assert_same_store(store, import_lerobot(out, tmp_path / "back.zarr", progress=False))
