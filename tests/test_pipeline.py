"""`robotrl run`: the whole pipeline on the default task through the console script, as the README starts it."""

import dataclasses
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from robotrl.stages.pipeline import (
    PPO_STAGES,
    SKIPPED_BY,
    STAGES,
    PipelineConfig,
    StageRow,
    paired_gain,
    read_rows,
    same_evaluation,
)
from robotrl.stages.recipes import recipe_for
from robotrl.training.loop import TRAIN_STATE

ROBOTRL = str(Path(sys.executable).parent / "robotrl")


def robotrl(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([ROBOTRL, *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    run_dir = tmp_path_factory.mktemp("pipeline") / "run"
    out = robotrl("run", "--budget", "smoke", "--run-dir", str(run_dir), "--no-progress", "--threads", "1")
    return run_dir, out


def test_smoke_budget_runs_every_stage_and_prints_the_table(smoke):
    run_dir, out = smoke
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_rows(run_dir / "stages.jsonl")
    assert [r.stage for r in rows] == list(STAGES)
    table = (run_dir / "summary.md").read_text()
    assert table.startswith("robotrl run: PushT (flow), budget smoke, success over 4 held-out episodes")  # no overrides
    for stage in STAGES:
        assert f"| {stage} |" in table and f"| {stage} |" in out.stdout
    by = {r.stage: r for r in rows}
    assert by["demos"].env_steps > 0 and by["demos"].extra["episodes"] >= 6
    assert by["online"].env_steps >= 512 and by["offline"].env_steps > 0  # both stages stepped the env
    # the student learns on its own DAgger episodes (which step the env too) besides the demos: the smoke online
    # stage's store is smaller than the demos (`test_distill_store_is_the_online_one_once_it_outweighs_the_demos`)
    assert by["distill"].extra["store"] == str(run_dir / "demos.zarr")
    assert by["distill"].env_steps > 0 and by["distill"].extra["dagger_pairs"] > 0
    gate = by["distill"].extra["gate"]  # the gate judged it: the student only where it did not lose to its start
    assert gate["kept"] == ("student" if gate["student_success"] >= gate["start_success"] else "start")
    # the online policy is handed on only if it does not lose to its start on the gate's episodes
    gate = by["online"].extra["gate"]
    assert gate["kept"] == ("online" if gate["online_success"] >= gate["start_success"] else "start")
    assert (run_dir / "online" / "rejected_policy").exists() == (gate["kept"] == "start")
    from robotrl.training.evaluate import evaluate_policy, load_any

    # every policy stage evaluated on the same held-out episodes, its latency measured; the one-step policy
    # replanning every `deploy_execute` actions (2 in the smoke budget), the others every `execute` (8)
    # and each row keeps its episodes' outcomes, in order, which the table's gain pairs with the row before's
    for before, r in itertools.pairwise(rows):
        policy = load_any(Path(r.output), threads=1)
        execute = 2 if r.stage in ("distill", "export") else 8
        stats = evaluate_policy(policy, 4, 4, execute=execute)
        assert stats.success_rate == r.success_rate, r.stage
        assert r.extra["outcomes"] == {"envs": 4, "success": "".join("1" if s else "0" for s in stats.success)}
        assert r.latency_ms > 0
        if before.stage == "demos":
            assert paired_gain(r, before) is None and f"| {r.stage} | {r.success_rate:.1%} | " in table
            continue
        gain, se = paired_gain(r, before)
        assert gain == pytest.approx(r.success_rate - before.success_rate)
        assert f"| {r.stage} | {r.success_rate:.1%} | " in table and f"| {100 * gain:+.1f} ± {100 * se:.1f} |" in table
    distill = json.loads((run_dir / "distill" / "config.json").read_text())
    assert distill["execute"] == 2  # its DAgger rounds and gate drive the student as it is deployed
    assert load_any(run_dir / "export").execute == 2 == by["export"].extra["execute"]  # and a robot runs it so
    # the one-step student answers in one network call: faster than the K-step policy it was distilled from
    assert by["distill"].latency_ms < by["online"].latency_ms


def test_a_stages_gain_pairs_its_episodes_with_the_stage_befores() -> None:
    """The gain's standard error is that of the per-episode differences: where the later stage fails only episodes
    the earlier one failed too it is smaller than two independent rates' (0.33 for 3/4 against 2/4), where they
    fail other episodes larger; episodes that do not pair (another env count, another number) give none."""

    def row(success: str, envs: int = 4) -> StageRow:
        return StageRow(
            "s",
            "o",
            success.count("1") / len(success),
            None,
            0,
            0.0,
            None,
            {"outcomes": {"envs": envs, "success": success}},
        )

    gain, se = paired_gain(row("1110"), row("1100"))
    assert gain == pytest.approx(0.25) and se == pytest.approx(0.25)  # differences 0, 0, 1, 0
    assert paired_gain(row("1100"), row("1100")) == (0.0, 0.0)
    gain, se = paired_gain(row("0011"), row("1100"))  # the same rate on other episodes: no gain, and a wide error
    assert gain == 0.0 and se == pytest.approx(np.std([-1, -1, 1, 1], ddof=1) / 2)
    assert paired_gain(row("1100", envs=2), row("1100")) is None and paired_gain(row("110"), row("1100")) is None
    assert paired_gain(row("1100"), StageRow("demos", "d", 1.0, None, 0, 0.0, None)) is None


def test_each_stage_wrote_the_documented_files(smoke):
    run_dir, _ = smoke
    from robotrl.datasets import EpisodeStore
    from robotrl.policies import load, runtime

    store = EpisodeStore.open(run_dir / "demos.zarr")
    assert store.spec.task == "PushT" and store.spec.episode_steps == 150  # smoke's episodes: 150 of PushT's 600
    # PushT's teleop stand-in is noise 1.0; the pipeline's demos are capped at 0.5 (BC learns from those)
    assert {episode.meta["noise"] for episode in store} == {0.5}
    policies = {s: load(run_dir / s / "policy") for s in ("bc", "offline", "online", "distill")}
    for policy in policies.values():
        policy.check_spec(store.spec)
    assert policies["distill"].name == "consistency" and policies["online"].name == "flow"
    assert (run_dir / "distill" / "dagger.npz").exists()
    exported = runtime.load(run_dir / "export", seed=0)
    obs = {
        k: np.zeros((1, exported.obs_horizon, *store.spec.observations[k].shape), np.float32) for k in exported.obs_keys
    }
    chunk = exported.act(obs)
    assert chunk.shape == (1, exported.action_horizon, *store.spec.action.shape) and np.isfinite(chunk).all()
    config = yaml.safe_load((run_dir / "config.yaml").read_text())  # what ran: every setting, resolved
    assert (config["budget"], config["task"], config["policy"]) == ("smoke", "PushT", "flow")
    assert config["settings"] == recipe_for("PushT").settings("smoke").to_dict()
    offline = json.loads((run_dir / "offline" / "config.json").read_text())  # the recipe's success gate
    assert (offline["gate_episodes"], offline["gate_z"]) == (2, 1.0)
    row = {r.stage: r for r in read_rows(run_dir / "stages.jsonl")}["offline"]
    assert all(g["kept"] <= (g["new_success"] > g["start_success"]) for g in row.extra["gates"])
    if row.extra["kept_updates"] == 0:  # nothing kept: BC's weights are handed on, and BC's evaluation with them
        handed, bc = (load(run_dir / s / "policy").state_dict() for s in ("offline", "bc"))
        assert all(torch.equal(handed[k], bc[k]) for k in bc)
        assert row.extra["evaluation"] == "the bc stage's: the same policy files" and "eval_seconds" not in row.extra
    online = json.loads((run_dir / "online" / "config.json").read_text())  # the anchor and rate reach the stage
    settings = config["settings"]
    bc, distill = (json.loads((run_dir / s / "config.json").read_text()) for s in ("bc", "distill"))
    assert bc["success_tail"] == distill["success_tail"] == settings["success_tail"] == 20  # the recipe's, to both
    assert distill["solve_weight"] == settings["distill_solve_weight"] == 1.0  # the direct term reaches the student
    assert (online["lr"], online["bc_coef"]) == (settings["online_lr"], settings["online_bc_coef"]) == (3e-5, 1.0)
    # the stage chooses among its evaluations on training seeds, not the held-out ones its row reports, and hands
    # its best on (the gate then judges that one), the last weights kept beside it
    from robotrl.training.evaluate import HELD_OUT_SEED, ROLLOUT_SEED

    assert online["eval_every"] == 256 and ROLLOUT_SEED <= online["eval_seed"] < HELD_OUT_SEED
    row = {r.stage: r for r in read_rows(run_dir / "stages.jsonl")}["online"]
    assert row.extra["best"]["step"] in (256, 512) and (run_dir / "online" / "last_policy").exists()
    if row.extra["gate"]["kept"] == "online":
        handed, best = (load(run_dir / "online" / p).state_dict() for p in ("policy", "best_policy"))
        assert all(torch.equal(handed[k], best[k]) for k in best)


def test_resume_skips_finished_stages(smoke):
    run_dir, _ = smoke
    before = (run_dir / "stages.jsonl").read_text()
    out = robotrl("run", "--run-dir", str(run_dir), "--resume", "--no-progress", timeout=120)  # its own settings
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run_dir / "stages.jsonl").read_text() == before  # nothing re-run, the table printed from the files
    assert "| export |" in out.stdout


def test_resume_starts_a_stage_killed_part_way_over(smoke, tmp_path):
    """A pipeline killed inside its online stage: `--resume` runs that stage again from nothing. Its train state
    on disk would refuse a fresh start, and its best-checkpoint record would outrank the new run's evaluations.
    The resumed stages run with the resume's options (here: evaluated every 128 env steps by the one-step
    sampler) on top of the run's own config.yaml, recorded beside it."""
    run_dir = tmp_path / "run"
    shutil.copytree(smoke[0], run_dir)
    resumed = run_dir / "resumed.jsonl"
    resumed.unlink(missing_ok=True)  # test_resume_skips_finished_stages may have resumed the shared run already
    finished = (run_dir / "stages.jsonl").read_text().splitlines()[:3]  # demos, bc, offline
    (run_dir / "stages.jsonl").write_text("\n".join(finished) + "\n")
    assert (run_dir / "online" / TRAIN_STATE).exists()
    (run_dir / "online" / "best_policy.json").write_text(json.dumps({"step": 10**9, "success_rate": 2.0}))
    out = robotrl(
        "run",
        "--run-dir",
        str(run_dir),
        "--resume",
        "--no-progress",
        "--threads",
        "1",
        "--online-eval-every",
        "128",
        "--online-sampler-steps",
        "1",
        "--online-gate-episodes",
        "3",
        "--online-num-envs",
        "2",
        "--online-minibatch-size",
        "8",
        "--online-criterion",
        "stall",
        "--online-operator-fraction",
        "0.5",
        "--online-ema",
        "0.8",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_rows(run_dir / "stages.jsonl")
    assert [r.stage for r in rows] == list(STAGES) and [json.dumps(r.extra) for r in rows[:3]] == [
        json.dumps(json.loads(line)["extra"]) for line in finished
    ]
    assert rows[3].extra["best"]["step"] in (128, 256, 384, 512)  # this run's own evaluations, not the stale record
    # the table's header names the settings given on top of the run's config.yaml
    header = next(line for line in out.stdout.splitlines() if line.startswith("robotrl run:"))
    assert header.startswith(f"robotrl run: PushT (flow), config {run_dir / 'config.yaml'} (online_num_envs=2, ")
    assert "online_eval_every=128, online_gate_episodes=3, online_sampler_steps=1), success over 4" in header
    online = json.loads((run_dir / "online" / "config.json").read_text())
    assert online["eval_every"] == 128 and online["eval_sampler_steps"] == 1 and online["eval_episodes"] == 3
    assert (
        online["num_envs"],
        online["minibatch_size"],
        online["criterion"],
        online["operator_fraction"],
        online["ema"],
    ) == (2, 8, "stall", 0.5, 0.8)
    assert rows[3].extra["gate"]["start_success"] in (0.0, 1 / 3, 2 / 3, 1.0)
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["settings"]["online_sampler_steps"] is None
    assert [json.loads(line)["settings"]["online_sampler_steps"] for line in resumed.read_text().splitlines()] == [1]


def test_a_budget_leaves_out_the_rl_stages_and_hands_bc_on(smoke, tmp_path):
    """offline_iterations and online_total_steps at 0 leave those stages out: BC's policy is what the distillation
    learns from, and their rows carry BC's figures, saying so."""
    run_dir = tmp_path / "run"
    shutil.copytree(smoke[0], run_dir)
    (run_dir / "resumed.jsonl").unlink(missing_ok=True)
    finished = (run_dir / "stages.jsonl").read_text().splitlines()[:2]  # demos, bc
    (run_dir / "stages.jsonl").write_text("\n".join(finished) + "\n")
    skip = ("--offline-iterations", "0", "--online-total-steps", "0")
    out = robotrl("run", "--run-dir", str(run_dir), "--resume", "--no-progress", "--threads", "1", *skip)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r.stage: r for r in read_rows(run_dir / "stages.jsonl")}
    assert list(rows) == list(STAGES)
    for stage, before in (("offline", "bc"), ("online", "offline")):
        assert rows[stage].extra == {
            "skipped": f"{SKIPPED_BY[stage]} is 0: the {before} stage's policy handed on",
            "outcomes": rows["bc"].extra["outcomes"],  # BC's episodes, which the next stage's gain pairs with
        }
        assert (rows[stage].success_rate, rows[stage].env_steps) == (rows["bc"].success_rate, 0)
        assert f"| {stage} |" in out.stdout and f"skipped: {SKIPPED_BY[stage]} is 0" in out.stdout
    from robotrl.policies import load

    bc, taught = (load(run_dir / s / "policy").state_dict() for s in ("bc", "online"))
    assert all(torch.equal(taught[k], bc[k]) for k in bc)
    distill = json.loads((run_dir / "distill" / "config.json").read_text())
    assert (
        Path(distill["teacher"]) == run_dir / "online" / "policy" and Path(distill["store"]) == run_dir / "demos.zarr"
    )
    assert not (run_dir / "offline" / "config.json").exists() and not (run_dir / "online" / "hil.zarr").exists()


def test_a_runs_config_file_runs_its_settings_again(smoke, tmp_path):
    """`--config <run>/config.yaml` resolves to exactly what that run ran (`--print-config` shows it, running
    nothing); an option given beside it overrides the file's value."""
    run_dir, _ = smoke
    ran = (run_dir / "config.yaml").read_text()
    out = robotrl("run", "--config", str(run_dir / "config.yaml"), "--print-config", timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == ran
    out = robotrl("run", "--config", str(run_dir / "config.yaml"), "--bc-steps", "9", "--seed", "3", "--print-config")
    printed = yaml.safe_load(out.stdout)
    assert (printed["seed"], printed["settings"]["bc_steps"], printed["budget"]) == (3, 9, "smoke")
    assert {**printed["settings"], "bc_steps": 40} == yaml.safe_load(ran)["settings"]
    fresh = robotrl("run", "--budget", "smoke", "--threads", "1", "--print-config", "--run-dir", str(tmp_path / "x"))
    assert fresh.stdout == ran and not (tmp_path / "x").exists()  # the recipe's smoke budget, and nothing run


def test_a_second_fresh_run_into_the_same_dir_is_refused(smoke):
    run_dir, _ = smoke
    out = robotrl("run", "--budget", "smoke", "--run-dir", str(run_dir), timeout=120)
    assert out.returncode == 2 and "already holds a pipeline" in out.stderr


def test_resuming_a_run_dir_without_a_pipeline_is_refused(tmp_path):
    """--resume on a new directory (a typo in the path) says so instead of starting a new pipeline there."""
    from robotrl.stages.pipeline import PipelineConfig, run

    with pytest.raises(
        ValueError, match=r"PipelineConfig.resume: expected a run_dir holding a pipeline \(config.yaml\)"
    ):
        run(PipelineConfig(budget="smoke", run_dir=tmp_path / "new", resume=True, progress=False))
    assert not (tmp_path / "new").exists()
    # a pipeline killed in its first stage (config.yaml, no stages yet) is a pipeline too
    (tmp_path / "killed").mkdir()
    (tmp_path / "killed" / "config.yaml").write_text("task: PushT\n")
    with pytest.raises(FileExistsError, match=r"already holds a pipeline \(.*config.yaml\); .* \(--overwrite\)"):
        run(PipelineConfig(budget="smoke", run_dir=tmp_path / "killed", progress=False))
    with pytest.raises(ValueError, match=r"PipelineConfig.overwrite: expected either --resume or --overwrite"):
        PipelineConfig(run_dir=tmp_path / "killed", resume=True, overwrite=True)


def test_distill_store_is_the_online_one_once_it_outweighs_the_demos(tmp_path):
    from robotrl.datasets import EpisodeStore
    from robotrl.datasets.record import record_expert
    from robotrl.stages.pipeline import distill_store

    record_expert(tmp_path / "demos.zarr", "Reach", episodes=3, num_envs=3, episode_steps=20, progress=False).close()
    demo_steps = EpisodeStore.open(tmp_path / "demos.zarr").num_steps
    assert distill_store(tmp_path) == tmp_path / "demos.zarr"  # plain online RL: no store
    online, seed = tmp_path / "online" / "hil.zarr", 100
    while True:
        record_expert(online, "Reach", episodes=1, num_envs=1, episode_steps=20, seed=seed, progress=False).close()
        seed += 1
        if EpisodeStore.open(online).num_steps >= demo_steps:
            break
        assert distill_store(tmp_path) == tmp_path / "demos.zarr"  # fewer steps than the demos
    assert seed > 101 and distill_store(tmp_path) == online


def test_online_stage_hands_on_its_start_when_rl_made_it_worse(reach_bc_flow, tmp_path):
    """The acceptance test on real Reach rollouts: an online policy wrecked (its weights scrambled) loses to its
    half-trained start on the gate's episodes, so online/policy becomes the start's and the wrecked one is set aside."""
    import dataclasses

    import torch

    from robotrl.policies import load
    from robotrl.stages.pipeline import accept_online

    shutil.copytree(reach_bc_flow, tmp_path / "offline" / "policy")
    wrecked = load(reach_bc_flow)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in wrecked.parameters():
            p.add_(3.0 * torch.randn_like(p))
    wrecked.save(tmp_path / "online" / "policy")
    settings = dataclasses.replace(
        recipe_for("Reach").settings("smoke"), online_gate_episodes=20, eval_envs=20, execute=4
    )
    gate = accept_online(PipelineConfig(task="Reach", run_dir=tmp_path), settings, tmp_path)
    assert gate["kept"] == "start" and gate["start_success"] >= 0.2 > gate["online_success"], gate
    kept = (tmp_path / "online" / "policy" / "model.safetensors").read_bytes()
    assert kept == (reach_bc_flow / "model.safetensors").read_bytes()
    assert (tmp_path / "online" / "rejected_policy" / "model.safetensors").exists()
    # the start's files handed on: the start's held-out evaluation stands for the stage's; the wrecked one's would not
    start = StageRow("offline", str(tmp_path / "offline" / "policy"), 0.5, (0.4, 0.6), 0, 1.0, 3.0)
    assert same_evaluation(tmp_path / "online" / "policy", "online", start, settings)
    assert not same_evaluation(tmp_path / "online" / "rejected_policy", "online", start, settings)


def test_a_stage_is_evaluated_again_unless_its_files_and_execute_are_the_ones_before(reach_bc_flow, tmp_path):
    """The evaluation before is reused only for the very files, executed as many actions a chunk: one byte of the
    weights changed, or the one-step policy's `deploy_execute` against the chain's `execute`, evaluates again."""
    settings = recipe_for("PushT").settings("standard")  # execute 8, deploy_execute 2
    for stage in ("bc", "offline", "distill"):
        shutil.copytree(reach_bc_flow, tmp_path / stage)
    bc = StageRow("bc", str(tmp_path / "bc"), 0.9, (0.8, 0.95), 0, 1.0, 3.0)
    assert same_evaluation(tmp_path / "offline", "offline", bc, settings)
    assert not same_evaluation(tmp_path / "distill", "distill", bc, settings)  # executing 2, not 8
    assert not same_evaluation(tmp_path / "offline", "offline", None, settings)
    weights = tmp_path / "offline" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert not same_evaluation(tmp_path / "offline", "offline", bc, settings)


def test_online_stage_without_the_operator_trains_the_chain_with_the_anchor(reach_bc_flow, tmp_path):
    """`--no-interventions`: plain online RL, still PPO over the Flow-SDE chain with the velocity anchor (a method
    that freezes the network would leave the anchor nothing to hold), gated like the operator's stage."""
    from robotrl.stages.pipeline import stage_online

    shutil.copytree(reach_bc_flow, tmp_path / "offline" / "policy")
    config = PipelineConfig(
        task="Reach",
        budget="smoke",
        execute=4,
        run_dir=tmp_path,
        interventions=False,
        online_total_steps=256,
        online_num_envs=2,
        online_rollout_steps=64,
        threads=1,
        progress=False,
    )
    weights, steps, extra = stage_online(config, config.settings(), tmp_path)
    online = json.loads((tmp_path / "online" / "config.json").read_text())
    assert (online["method"], online["lr"], online["bc_coef"]) == ("flow_sde", 3e-5, 1.0)
    assert steps >= 256 and extra["gate"]["kept"] in ("online", "start") and weights.exists()
    assert not (tmp_path / "online" / "hil.zarr").exists()  # no operator, nothing recorded


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match=r"PipelineConfig.budget: expected one of .*got 'huge'"):
        PipelineConfig(budget="huge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"PipelineConfig.bc_steps: expected > 0, got 0"):
        PipelineConfig(bc_steps=0)
    with pytest.raises(ValueError, match=r"PipelineConfig.bc_lr: expected > 0, got -0.001"):
        PipelineConfig(bc_lr=-1e-3)
    with pytest.raises(ValueError, match=r"PipelineConfig.bc_channels: expected > 0, got \(32, 0, 128\)"):
        PipelineConfig(bc_channels=(32, 0, 128))
    with pytest.raises(ValueError, match=r"PipelineConfig.offline_extraction: expected one of 'ppo', 'awr', got 'dpo'"):
        PipelineConfig(offline_extraction="dpo")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"PipelineConfig.device: expected a torch device such as 'cpu' or 'cuda', got 'gpu'"
    ):
        PipelineConfig(device="gpu")
    with pytest.raises(ValueError, match=r"PipelineConfig.demo_noise: expected a finite number >= 0, got nan"):
        PipelineConfig(demo_noise=float("nan"))
    with pytest.raises(ValueError, match=r"PipelineConfig.bc_steps: expected int, got 2.5"):
        PipelineConfig(bc_steps=2.5)  # type: ignore[arg-type]
    for name in ("online_lr", "online_sampler_steps", "online_num_envs", "offline_gate_episodes", "deploy_execute"):
        with pytest.raises(ValueError, match=rf"PipelineConfig.{name}: expected > 0, got 0"):
            PipelineConfig(**{name: 0.0 if name == "online_lr" else 0})
    with pytest.raises(ValueError, match=r"PipelineConfig.online_minibatch_size: expected > 0, got -1"):
        PipelineConfig(online_minibatch_size=-1)
    for name in ("online_total_steps", "offline_iterations", "success_tail"):  # 0 leaves a stage (the tail) out
        with pytest.raises(ValueError, match=rf"PipelineConfig.{name}: expected a finite number >= 0, got -1"):
            PipelineConfig(**{name: -1})
    with pytest.raises(
        ValueError, match=r"PipelineConfig.online_criterion: expected one of 'stray', 'stall', got 'lost'"
    ):
        PipelineConfig(online_criterion="lost")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"PipelineConfig.online_ema: expected a decay in \[0, 1\), got 1.0"):
        PipelineConfig(online_ema=1.0)
    with pytest.raises(
        ValueError, match=r"PipelineConfig.online_operator_fraction: expected a share in \[0, 1\], got 1.5"
    ):
        PipelineConfig(online_operator_fraction=1.5)
    with pytest.raises(
        ValueError,
        match=r"PipelineConfig.interventions: the operator's options .*'stall'.*got interventions=False",
    ):
        PipelineConfig(interventions=False, online_criterion="stall")
    with pytest.raises(ValueError, match=r"PipelineConfig.online_bc_coef: expected a finite number >= 0, got inf"):
        PipelineConfig(online_bc_coef=float("inf"))
    with pytest.raises(
        ValueError, match=r"PipelineConfig.demonstrator: gym:Hopper-v5 is an outside env, without a scripted expert"
    ):
        PipelineConfig(task="gym:Hopper-v5")
    with pytest.raises(ValueError, match=r"PipelineConfig.demo_noise: applies to a task's scripted expert, not to"):
        PipelineConfig(task="gym:Hopper-v5", demonstrator="my_envs:Scripted", demo_noise=0.5)
    with pytest.raises(ValueError, match=r"PipelineConfig.distill_gate_episodes: expected > 0, got -1"):
        PipelineConfig(distill_gate_episodes=-1)
    with pytest.raises(ValueError, match=r"PipelineConfig.task: expected a task with a recipe, one of .*got 'Nope'"):
        PipelineConfig(task="Nope")
    # an option overrides its recipe value and nothing else
    recipe = recipe_for("PushT").settings("full")
    settings = PipelineConfig(budget="full", bc_batch_size=256, bc_lr=1e-3, bc_channels=[32, 64, 128]).settings()  # type: ignore[arg-type]
    assert settings == dataclasses.replace(recipe, bc_batch_size=256, bc_lr=1e-3, bc_policy={"channels": (32, 64, 128)})
    assert PipelineConfig(budget="smoke", bc_steps=7).settings().bc_steps == 7


def test_quadrupeds_recipe_trains_ppo_and_deploys_what_it_trained(tmp_path):
    """`robotrl run --task Quadruped`: the PPO chain (ppo -> export) by the recipe's settings, judged by the task's
    own measures (the share of steps tracking the command, the fall rate) besides success; the export acts as the
    policy it exports on the same held-out episodes, and the run's config.yaml reruns it to the same weights."""
    from safetensors.torch import load_file

    from robotrl.envs import make_task
    from robotrl.policies.timing import torch_threads
    from robotrl.training.evaluate import evaluate_policy, load_any

    run_dir = tmp_path / "quad"
    args = ("--run-dir", str(run_dir), "--no-progress", "--threads", "1")
    out = robotrl("run", "--task", "Quadruped", "--budget", "smoke", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_rows(run_dir / "stages.jsonl")
    assert [r.stage for r in rows] == list(PPO_STAGES)
    ppo, export = rows
    assert ppo.env_steps == 2560 and ppo.output == str(run_dir / "ppo" / "policy")
    assert export.extra["source"] == ppo.output and export.output == str(run_dir / "export")
    assert "| stage | success | 95% CI | gain ± SE (points) | fall_rate | tracking | env steps |" in out.stdout
    # the task's measures, recomputed from the saved policy on the held-out seeds; the export's are the same
    with torch_threads(1):
        stats = evaluate_policy(load_any(Path(ppo.output), threads=1), 4, 4, execute=1)
    assert make_task("Quadruped").measures(stats) == ppo.extra["measures"] == export.extra["measures"]
    assert set(ppo.extra["measures"]) == {"fall_rate", "tracking"}
    assert export.success_rate == ppo.success_rate == stats.success_rate
    # the recipe's settings ran, and PPO got them
    ran = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert ran["policy"] == "gaussian" and ran["settings"] == recipe_for("Quadruped").settings("smoke").to_dict()
    trained = json.loads((run_dir / "ppo" / "config.json").read_text())
    assert (trained["num_envs"], trained["rollout_steps"], trained["hidden"]) == (8, 16, [32, 32])
    # one command runs it again: CPU PPO at a seed and thread count is deterministic, so the weights are the same
    out = robotrl("run", "--config", str(run_dir / "config.yaml"), "--run-dir", str(tmp_path / "again"))
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = (load_file(d / "ppo" / "policy" / "model.safetensors") for d in (run_dir, tmp_path / "again"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_a_recipe_takes_only_the_options_of_its_chain():
    with pytest.raises(ValueError, match=r"PipelineConfig.bc_steps: the settings run here \(ppo -> export\) have no"):
        PipelineConfig(task="Quadruped", bc_steps=4)
    with pytest.raises(ValueError, match=r"PipelineConfig.ppo_total_steps: the settings run here \(demos -> bc -> "):
        PipelineConfig(ppo_total_steps=4)
    with pytest.raises(ValueError, match=r"PipelineConfig.policy: Quadruped.yaml trains gaussian by PPO, from no demo"):
        PipelineConfig(task="Quadruped", policy="flow")
    with pytest.raises(ValueError, match=r"PipelineConfig.policy: expected a registered flow policy .* got 'gaussian'"):
        PipelineConfig(task="PushT", policy="gaussian")
    settings = PipelineConfig(task="Quadruped", budget="smoke", ppo_total_steps=256, eval_episodes=2).settings()
    assert (settings.ppo_total_steps, settings.eval_episodes) == (256, 2)  # type: ignore[union-attr]


@pytest.mark.parametrize("policy, images", [("flow", False), ("vla", True)])
def test_demos_carry_camera_images_only_for_the_vla(tmp_path, policy, images):
    """The pipeline's flow policy is the state one: on a camera task its demos (and so its BC, rollouts and
    evaluations) skip rendering; the VLA's demos keep both cameras."""
    from robotrl.datasets import EpisodeStore
    from robotrl.stages.pipeline import stage_demos

    config = PipelineConfig(task="PickPlace", budget="smoke", policy=policy, demo_episodes=1, progress=False)
    out, steps, _ = stage_demos(config, config.settings(), tmp_path)
    with EpisodeStore.open(out) as store:
        keys = set(store.spec.observations)
    assert steps == 150 and "state" in keys
    assert {"image_front", "image_wrist"} <= keys if images else not any(k.startswith("image") for k in keys)


def test_the_vla_trains_by_its_own_bc_recipe(tmp_path):
    """PickPlace's VLA recipe takes one frame at batch 32 and lr 3e-4 (the flow policy's two frames at batch 64 and
    lr 1e-3 trained it to less: bench/RESULTS.md, "The VLA's BC recipe, and the online stage from its 16,000-step
    BC"); its default recipe trains the state flow policy; options override either."""
    from robotrl.policies import FlowConfig, VLAConfig, load
    from robotrl.stages.pipeline import bc_options, stage_bc, stage_demos

    vla = PipelineConfig(task="PickPlace", policy="vla")
    assert bc_options(vla, vla.settings()) == {"batch_size": 32, "lr": 3e-4, "policy": VLAConfig(obs_horizon=1)}
    mine = PipelineConfig(task="PickPlace", policy="vla", bc_batch_size=48, bc_lr=1e-4)
    assert bc_options(mine, mine.settings()) == {"batch_size": 48, "lr": 1e-4, "policy": VLAConfig(obs_horizon=1)}
    flow = PipelineConfig(task="PickPlace")
    assert bc_options(flow, flow.settings()) == {
        "batch_size": 64,
        "lr": 1e-3,
        "policy": FlowConfig(channels=(32, 64, 128)),
    }

    smoke = PipelineConfig(
        task="PickPlace", policy="vla", budget="smoke", demo_episodes=1, bc_steps=2, threads=1, progress=False
    )
    assert bc_options(smoke, smoke.settings())["batch_size"] == 16  # smoke's batch stays small
    stage_demos(smoke, smoke.settings(), tmp_path)
    checkpoint, _, _ = stage_bc(smoke, smoke.settings(), tmp_path)
    policy = load(checkpoint)
    assert policy.name == "vla" and policy.config.obs_horizon == 1
    trained = json.loads((tmp_path / "bc" / "config.json").read_text())
    assert (trained["batch_size"], trained["lr"], trained["policy"]["obs_horizon"]) == (16, 3e-4, 1)


def test_an_outside_env_runs_every_stage_with_the_users_demonstrator(tmp_path, monkeypatch):
    """`robotrl run --task <module>:<callable> --demonstrator <module>:<callable>`: the user's demonstrator records
    the demos and is the online stage's operator; every stage is evaluated on the env's own success. An env that
    reports no success is refused in one line before anything is recorded."""
    from robotrl.datasets import EpisodeStore
    from robotrl.stages.pipeline import run

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "envs"))  # outside_envs: the user's own module
    monkeypatch.chdir(tmp_path)
    point = "outside_envs:make_point?radius=0.1"
    config = PipelineConfig(
        task=point, demonstrator="outside_envs:Demonstrator", budget="smoke", threads=1, progress=False, run_dir="run"
    )
    rows = run(config)
    assert [r.stage for r in rows] == list(STAGES) and rows[0].success_rate == 1.0  # the demonstrator's demos
    assert all(r.success_rate is not None for r in rows)
    with EpisodeStore.open(tmp_path / "run" / "demos.zarr") as demos:
        assert demos.spec.task == point and demos.episodes[0]["demonstrator"] == "outside_envs:Demonstrator"
    with EpisodeStore.open(tmp_path / "run" / "online" / "hil.zarr") as online:
        assert {e.get("operator") for e in online.episodes} == {"outside_envs:Demonstrator"}
    pendulum = PipelineConfig(task="gym:Pendulum-v1", demonstrator="outside_envs:Demonstrator", run_dir="p")
    with pytest.raises(ValueError, match=r"PipelineConfig.task: gym:Pendulum-v1 reports no success"):
        run(pendulum)
    assert not (tmp_path / "p" / "demos.zarr").exists()
