"""The zarr episode store: round trip, crash safety under SIGKILL, a reader beside a writer, validation."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from robotrl import ArraySpec, Spec, SpecMismatchError
from robotrl.datasets import CorruptChunkError, EpisodeStore, StoreError, validate
from robotrl.datasets.ops import DataMerge, merge
from robotrl.datasets.record import record_expert

SPEC = Spec(
    task="Synthetic",
    observations={
        "state": ArraySpec((6,), "float32"),
        "image_front": ArraySpec((24, 24, 3), "uint8", 0, 255),
        "instruction": ArraySpec((), "str"),
    },
    action=ArraySpec((2,), "float32", -1.0, 1.0),
    action_mode="ee_delta",
    control_hz=10.0,
)


def episode_length(k: int) -> int:
    return 20 + (k * 37) % 50


def episode_data(k: int) -> dict[str, np.ndarray]:
    """Deterministic contents of episode k, so a reader can check every row it sees."""
    n = episode_length(k)
    t = np.arange(n)
    return {
        "state": (k * 1000 + t[:, None] + np.arange(6)).astype(np.float32),
        "image_front": ((k * 7 + t[:, None, None, None]) % 256 * np.ones((1, 24, 24, 3))).astype(np.uint8),
        "action": np.stack([np.sin(t + k), np.cos(t + k)], -1).astype(np.float32) * 0.9,
        "reward": t.astype(np.float32) / n,
        "terminated": t == n - 1,
        "truncated": np.zeros(n, bool),
        "success": t == n - 1,
        "intervention": t % 5 == 0,
        "timestamp": 1.7e9 + k + t / 10.0,
    }


def check_episode(store: EpisodeStore, i: int) -> None:
    ep = store.episode(i)
    k = int(ep.meta["k"])
    for key, want in episode_data(k).items():
        np.testing.assert_array_equal(ep.data[key], want.astype(store.arrays_spec[key].dtype), err_msg=f"{key} ep {i}")
    assert ep.meta["instruction"] == f"task {k}"


WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[3])
    from test_store import SPEC, episode_data
    from robotrl.datasets import EpisodeStore
    store = EpisodeStore.create(sys.argv[1], SPEC, exist_ok=True)
    count, pause = int(sys.argv[2]), float(sys.argv[4])
    k = store.num_episodes
    while k < count:
        w = store.writer(source="teleop", robot="test", k=k)
        d = episode_data(k)
        for t in range(len(d["action"])):
            w.add({"state": d["state"][t], "image_front": d["image_front"][t], "instruction": f"task {k}"},
                  d["action"][t], d["reward"][t], d["terminated"][t], d["truncated"][t], d["success"][t],
                  d["intervention"][t], d["timestamp"][t])
        w.finalize()
        print(k, flush=True)
        k += 1
        time.sleep(pause)
""")


def start_writer(path: Path, count: int, pause: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(count), str(Path(__file__).parent), str(pause)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_round_trip_metadata_and_stats(tmp_path: Path) -> None:
    store = EpisodeStore.create(tmp_path / "d.zarr", SPEC)
    for k in range(3):
        d = episode_data(k)
        store.append_episode(d, {"k": k, "instruction": f"task {k}", "success": True, "source": "scripted"})
    reader = EpisodeStore.open(tmp_path / "d.zarr")
    assert reader.spec == SPEC and reader.num_episodes == 3
    assert reader.num_steps == sum(episode_length(k) for k in range(3))
    for i in range(3):
        check_episode(reader, i)
    stats = reader.stats()
    allstate = np.concatenate([episode_data(k)["state"] for k in range(3)]).astype(np.float64)
    np.testing.assert_allclose(stats["state"]["mean"], allstate.mean(0), rtol=1e-9)
    np.testing.assert_allclose(stats["state"]["std"], allstate.std(0), rtol=1e-6)
    np.testing.assert_array_equal(
        stats["action"]["max"], np.concatenate([episode_data(k)["action"] for k in range(3)]).max(0)
    )
    assert "image_front" not in stats  # images normalize by /255, not by statistics
    assert validate(reader) == []


def test_truncate_drops_the_newest_episodes_and_recounts_the_stats(tmp_path: Path) -> None:
    """What a resumed off-policy run does with the episodes it recorded after its last checkpoint."""
    store = EpisodeStore.create(tmp_path / "d.zarr", SPEC)
    for k in range(4):
        store.append_episode(episode_data(k), {"k": k, "instruction": f"task {k}"})
    with pytest.raises(ValueError, match=r"truncate: expected 0..4 episodes to keep, got 5"):
        store.truncate(5)
    store.truncate(2)
    assert store.num_episodes == 2 and store.array("state").shape[0] == store.num_steps == episode_length(
        0
    ) + episode_length(1)
    kept = np.concatenate([episode_data(k)["state"] for k in range(2)]).astype(np.float64)
    np.testing.assert_allclose(store.stats()["state"]["mean"], kept.mean(0), rtol=1e-9)
    np.testing.assert_array_equal(store.stats()["state"]["max"], kept.max(0))
    store.append_episode(episode_data(9), {"k": 9, "instruction": "task 9"})  # appending goes on after the cut
    store.close()
    reader = EpisodeStore.open(tmp_path / "d.zarr")
    assert [e["k"] for e in reader.episodes] == [0, 1, 9] and validate(reader) == []
    for i in range(3):
        check_episode(reader, i)


def test_writer_checks_every_step(tmp_path: Path) -> None:
    store = EpisodeStore.create(tmp_path / "d.zarr", SPEC)
    w = store.writer()
    obs = {"state": np.zeros(6, np.float32), "image_front": np.zeros((24, 24, 3), np.uint8), "instruction": "a"}
    with pytest.raises(SpecMismatchError, match=r"step 0: observation 'state': expected shape \(6,\), got \(5,\)"):
        w.add({**obs, "state": np.zeros(5, np.float32)}, np.zeros(2))
    with pytest.raises(SpecMismatchError, match="observation 'image_front' missing"):
        w.add({"state": obs["state"], "instruction": "a"}, np.zeros(2))
    with pytest.raises(ValueError, match="action has NaN"):
        w.add(obs, np.array([np.nan, 0.0]))
    with pytest.raises(SpecMismatchError, match=r"action: expected shape \(2,\), got \(3,\)"):
        w.add(obs, np.zeros(3))
    with pytest.raises(StoreError, match="no steps"):
        w.finalize()
    w.add(obs, np.zeros(2))
    with pytest.raises(StoreError, match="'instruction' changed within an episode"):
        w.add({**obs, "instruction": "b"}, np.zeros(2))
    w.discard()
    assert store.num_episodes == 0
    with pytest.raises(ValueError, match="source: expected one of"):
        store.writer(source="robot")


def test_one_writer_at_a_time_and_read_only(tmp_path: Path) -> None:
    store = EpisodeStore.create(tmp_path / "d.zarr", SPEC)
    with pytest.raises(StoreError, match="another process is writing"):
        EpisodeStore.open(tmp_path / "d.zarr", mode="a")
    with pytest.raises(StoreError, match="already exists"):
        EpisodeStore.create(tmp_path / "d.zarr", SPEC)
    store.close()
    reader = EpisodeStore.open(tmp_path / "d.zarr")
    with pytest.raises(StoreError, match="read-only"):
        reader.append_episode(episode_data(0), {})
    with pytest.raises(StoreError, match="not a robotrl episode store"):
        EpisodeStore.open(tmp_path / "nothing.zarr")


def test_spec_mismatch_names_the_field(tmp_path: Path) -> None:
    EpisodeStore.create(tmp_path / "d.zarr", SPEC).close()
    other = Spec(**{**SPEC.__dict__, "control_hz": 20.0})
    with pytest.raises(SpecMismatchError, match=r"spec.control_hz: store d.zarr has 10.0, requested spec has 20.0"):
        EpisodeStore.create(tmp_path / "d.zarr", other, exist_ok=True)
    store = EpisodeStore.open(tmp_path / "d.zarr")
    with pytest.raises(SpecMismatchError, match=r"spec.observations.state.shape"):
        store.check_spec(
            Spec(**{**SPEC.__dict__, "observations": {**SPEC.observations, "state": ArraySpec((7,), "float32")}})
        )
    assert any("control_hz" in e for e in validate(store, other))


def test_sigkill_mid_episode_keeps_every_finalized_episode(tmp_path: Path) -> None:
    """A real writer process is SIGKILLed at random moments (often inside the commit of an episode with image
    chunks); every episode it reported finalized must open intact, and a new writer continues the store."""
    path = tmp_path / "d.zarr"
    rng = np.random.default_rng(0)
    reported = 0
    for round_ in range(4):
        proc = start_writer(path, count=10_000)
        target = reported + 2 + round_
        done = []
        assert proc.stdout is not None
        while len(done) < target - reported:
            line = proc.stdout.readline()
            assert line, f"writer died: {proc.stderr.read() if proc.stderr else ''}"
            done.append(int(line))
        time.sleep(float(rng.uniform(0.0, 0.05)))  # land inside the next episode's recording or commit
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        reported = done[-1] + 1
        store = EpisodeStore.open(path)
        assert store.num_episodes >= reported, f"round {round_}: lost finalized episodes"
        assert validate(store) == []
        for i in range(store.num_episodes):
            check_episode(store, i)
        reported = store.num_episodes
    appended = EpisodeStore.open(path, mode="a")  # trims the killed writer's uncommitted rows
    assert all(appended.array(k).shape[0] == appended.num_steps for k in appended.arrays_spec)
    assert not list(path.rglob("*.partial"))
    appended.append_episode(episode_data(99), {"k": 99, "instruction": "task 99"})
    check_episode(EpisodeStore.open(path), reported)


def test_reader_opens_while_writer_appends(tmp_path: Path) -> None:
    path = tmp_path / "d.zarr"
    proc = start_writer(path, count=15, pause=0.02)
    try:
        while not (path / "meta" / "zarr.json").exists() or not (path / "zarr.json").exists():
            time.sleep(0.01)
        reader, seen = None, []
        while proc.poll() is None or (reader is not None and reader.num_episodes < 15):
            if reader is None:
                try:
                    reader = EpisodeStore.open(path)
                except StoreError:  # the root attributes are written last: not yet a store
                    time.sleep(0.01)
                    continue
            reader.refresh()
            seen.append(reader.num_episodes)
            for i in range(reader.num_episodes):
                check_episode(reader, i)
            if proc.poll() is not None and reader.num_episodes < 15:  # the writer ended between two refreshes
                reader.refresh()
                seen.append(reader.num_episodes)
                break
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert seen == sorted(seen) and seen[-1] == 15 and len(set(seen)) > 3, seen


def test_corrupted_and_missing_chunks_name_their_episodes(tmp_path: Path) -> None:
    store = EpisodeStore.create(tmp_path / "d.zarr", SPEC)
    for k in range(6):
        store.append_episode(episode_data(k), {"k": k, "instruction": f"task {k}"})
    rows = store.array("image_front").chunks[0]
    chunk = tmp_path / "d.zarr" / "data" / "image_front" / "c" / "1" / "0" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    eps = sorted(
        {int(np.searchsorted(store.episode_ends, r, side="right")) for r in range(rows, min(2 * rows, store.num_steps))}
    )
    errors = validate(EpisodeStore.open(tmp_path / "d.zarr"))
    assert len(errors) == 1 and "data/image_front chunk 1" in errors[0] and f"episode(s) {eps}" in errors[0], errors
    with pytest.raises(CorruptChunkError, match=r"image_front chunk 1 .*episode\(s\) " + re.escape(str(eps))):
        EpisodeStore.open(tmp_path / "d.zarr").episode(eps[0])
    # truncated file and a deleted file
    state_chunk = tmp_path / "d.zarr" / "data" / "state" / "c" / "0" / "0"
    state_chunk.write_bytes(state_chunk.read_bytes()[:20])
    (tmp_path / "d.zarr" / "data" / "reward" / "c" / "0").unlink()
    errors = validate(EpisodeStore.open(tmp_path / "d.zarr"))
    assert any("data/state chunk 0" in e and "episode(s) [0, 1, 2, 3, 4, 5]" in e for e in errors), errors
    assert any("data/reward chunk 0" in e and "missing chunk file" in e for e in errors), errors


def test_scripted_demos_record_real_episodes(tmp_path: Path) -> None:
    store = record_expert(tmp_path / "pusht.zarr", "PushT", episodes=3, num_envs=3, episode_steps=30, progress=False)
    assert store.num_episodes == 3 and store.num_steps == 90
    ep = store.episode(1)
    assert ep.meta["source"] == "scripted" and ep.meta["noise"] == store.episodes[0]["noise"]
    assert ep.data["truncated"][-1] and not ep.data["truncated"][:-1].any()
    assert np.all(np.diff(ep.data["timestamp"]) >= 0)
    # the recorded state is what the env produced: the joint_pos field stays within the spec's joint limits
    joint = ep.data["state"][:, store.spec.observations["state"].field_slices()["joint_pos"]]
    limits = np.asarray(store.spec.joint_limits)
    assert np.all(joint >= limits[:, 0] - 1e-3) and np.all(joint <= limits[:, 1] + 1e-3)


def test_recording_commits_exactly_the_episodes_asked_for(tmp_path: Path) -> None:
    """Eight envs whose episodes all end on one step, four episodes asked for: four, the first envs' (eight were
    committed before); appending five more with three envs runs two rounds and keeps five."""
    store = record_expert(tmp_path / "r.zarr", "Reach", episodes=4, num_envs=8, episode_steps=10, progress=False)
    assert store.num_episodes == 4 and store.num_steps == 40
    first = [store.episode(i).data["state"][0] for i in range(4)]
    store.close()
    again = record_expert(tmp_path / "r8.zarr", "Reach", episodes=8, num_envs=8, episode_steps=10, progress=False)
    for i in range(4):  # the same envs' episodes as the first four of an eight-episode recording
        np.testing.assert_array_equal(again.episode(i).data["state"][0], first[i])
    again.close()
    store = record_expert(tmp_path / "r.zarr", "Reach", episodes=5, num_envs=3, episode_steps=10, progress=False)
    assert store.num_episodes == 9 and validate(store) == []


def test_a_store_killed_while_it_is_created_leaves_nothing_and_a_rerun_works(tmp_path: Path) -> None:
    """`data record` SIGKILLed half-way through making its new store (after two of its arrays): nothing at the
    store's path, and the rerun creates and records as if the first had never run."""
    path = tmp_path / "new.zarr"
    code = textwrap.dedent(
        f"""
        import os, signal, zarr
        made = []
        create_array = zarr.Group.create_array
        def dying(self, *args, **kwargs):
            made.append(args)
            if len(made) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return create_array(self, *args, **kwargs)
        zarr.Group.create_array = dying
        from robotrl.datasets.record import record_expert
        record_expert({str(path)!r}, "Reach", episodes=2, num_envs=2, episode_steps=10, progress=False)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not path.exists() and len(list(tmp_path.glob(".new.zarr.partial-*"))) == 1  # the half-made one, aside
    store = record_expert(path, "Reach", episodes=2, num_envs=2, episode_steps=10, progress=False)
    assert store.num_episodes == 2 and validate(store) == []
    assert not list(tmp_path.glob(".new.zarr.partial-*"))  # the dead process's leftovers removed


def test_a_merge_killed_half_way_leaves_nothing_and_a_rerun_works(tmp_path: Path) -> None:
    """`data merge` SIGKILLed after three of its four episodes were committed to the new store: no store at
    `--out` (it left one that validated as whole with three), and the rerun merges all four."""
    for name in ("a", "b"):
        record_expert(tmp_path / f"{name}.zarr", "Reach", episodes=2, num_envs=2, episode_steps=10, progress=False)
    out = tmp_path / "m.zarr"
    code = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from robotrl.datasets import EpisodeStore
        from robotrl.datasets.ops import DataMerge, merge
        append = EpisodeStore.append_episode
        def dying(self, *args, **kwargs):
            index = append(self, *args, **kwargs)
            if index == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return index
        EpisodeStore.append_episode = dying
        merge(DataMerge(inputs=[Path({str(tmp_path / "a.zarr")!r}), Path({str(tmp_path / "b.zarr")!r})],
                        out=Path({str(out)!r})))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not out.exists()
    merged = merge(DataMerge(inputs=[tmp_path / "a.zarr", tmp_path / "b.zarr"], out=out))
    assert merged.num_episodes == 4 and validate(merged) == [] and not list(tmp_path.glob(".m.zarr.partial-*"))


@pytest.mark.parametrize(
    ("file", "what"),
    [
        ("zarr.json", "a zarr group's"),
        ("meta/zarr.json", "the commit record's"),
        ("data/action/zarr.json", "an array's"),
    ],
)
def test_a_damaged_metadata_file_is_named(file: str, what: str, tmp_path: Path) -> None:
    record_expert(tmp_path / "r.zarr", "Reach", episodes=1, num_envs=1, episode_steps=5, progress=False).close()
    (tmp_path / "r.zarr" / file).write_text('{"bad')
    with pytest.raises(StoreError, match=re.escape(f"r.zarr/{file}: expected {what} JSON, got an error: ")):
        EpisodeStore.open(tmp_path / "r.zarr")


def test_the_commit_record_is_checksummed_and_its_statistics_checked(tmp_path: Path) -> None:
    """An edited commit record (a collapsed action range) is refused on open, naming the file; statistics that
    were sealed as they are but cannot be right (a NaN sum) open, but `validate` names them and training cannot
    read them."""
    from robotrl.datasets.store import meta_checksum

    record_expert(tmp_path / "r.zarr", "Reach", episodes=2, num_envs=2, episode_steps=10, progress=False).close()
    file = tmp_path / "r.zarr" / "meta" / "zarr.json"
    good = json.loads(file.read_text())
    meta = good["attributes"]
    assert meta["checksum"] == meta_checksum(meta)
    collapsed = json.loads(json.dumps(good))
    collapsed["attributes"]["stats"]["action"]["max"] = collapsed["attributes"]["stats"]["action"]["min"]
    file.write_text(json.dumps(collapsed))
    with pytest.raises(
        StoreError, match=r"r.zarr/meta/zarr.json: checksum: expected .* \(the commit record was edited"
    ):
        EpisodeStore.open(tmp_path / "r.zarr")
    resealed = json.loads(json.dumps(good))
    resealed["attributes"]["stats"]["action"]["sum"][0] = float("nan")
    resealed["attributes"]["checksum"] = meta_checksum(resealed["attributes"])
    file.write_text(json.dumps(resealed))
    store = EpisodeStore.open(tmp_path / "r.zarr")
    assert any("stats.action.sum: expected finite values" in e for e in validate(store)), validate(store)
    with pytest.raises(StoreError, match=r"stats.action.sum: expected finite values"):
        store.stats()
    file.write_text(json.dumps(good))
    assert validate(EpisodeStore.open(tmp_path / "r.zarr")) == []


def test_store_owned_metadata_and_a_refused_spec_release_the_writer(tmp_path: Path) -> None:
    store = EpisodeStore.create(tmp_path / "d.zarr", SPEC)
    with pytest.raises(StoreError, match=r"metadata key\(s\) \['end'\] are set by the store"):
        store.append_episode(episode_data(0), {"end": 3})
    assert store.num_episodes == 0
    store.close()
    with pytest.raises(SpecMismatchError):
        EpisodeStore.create(tmp_path / "d.zarr", Spec(**{**SPEC.__dict__, "control_hz": 5.0}), exist_ok=True)
    EpisodeStore.open(tmp_path / "d.zarr", mode="a").close()  # the refused open did not keep the lock
