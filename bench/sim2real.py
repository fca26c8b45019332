"""The sim-to-real gap, measured on the "real twin": each policy over ROS 2 on the nominal sim robot and on sim
robots with perturbed dynamics (`perturbation:=task`: one fixed draw of the task's sim-to-real randomization per
twin -- friction, masses, damping, actuator gains, command latency, camera and light), for policies trained with
and without domain randomization.

Both nodes run as a robot runs them (their own processes, the launch table, the safety filter with the robot's
real limits) in lockstep, so an episode takes as long as the policy and the physics need. The baseline is the
same policy on the nominal sim robot, same episodes, same process: `vs_nominal` is the twin's success over it. The
first row is the export in process (the runtime, no ROS) on the very episodes the nominal sim robot runs: what
ROS 2 and the safety filter change.

Prints one JSON line per (policy, robot):
  robot          in_process, nominal, or twin<i> (sim robot seed = twin index: which draw of the randomization)
  success_rate, ci95   over `episodes` episodes from held-out seeds (Wilson 95%); vs_nominal
  measures       the task's own where it has them (`Task.measures`; Quadruped: tracking, fall_rate)

    .venv/bin/python bench/sim2real.py --policies no_dr=runs/student-onnx dr=runs/student-dr-onnx --episodes 50
    .venv/bin/python bench/sim2real.py --policies ppo=runs/quad/export --robot sim_quadruped --twins 0
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rclpy
import tyro

from robotrl.envs import make
from robotrl.envs.rollouts import EpisodeStats, run_episodes
from robotrl.hardware import nodes
from robotrl.hardware.ros_eval import evaluate_over_ros
from robotrl.policies import runtime
from robotrl.training.evaluate import HELD_OUT_SEED, controller_for, seeded_sampling

DOMAIN = 58


@dataclass
class Sim2RealBenchConfig:
    policies: tuple[str, ...] = ()
    """label=exported policy directory (`robotrl policy export`)"""
    episodes: int = 50
    twins: int = 3
    """perturbed robots (independent draws of the randomization), each run for `episodes` episodes"""
    seed: int = HELD_OUT_SEED
    robot: str = "sim_panda"
    """the robot file both nodes use (its limits are the safety filter's)"""
    threads: int = 1
    domain: int = DOMAIN
    """ROS domain id of the run (two benches side by side need two)"""


def task_of(policy: Path) -> str:
    return str(json.loads((policy / "manifest.json").read_text())["spec"]["task"])


def in_process(policy: Path, config: Sim2RealBenchConfig) -> EpisodeStats:
    """The export's episodes in process, on the one-env stream the sim robot draws from (`ros_eval`)."""
    loaded = runtime.load(policy, threads=config.threads)
    env = make(task_of(policy), num_envs=1, seed=config.seed)
    controller = controller_for(loaded, execute=8)
    controller.reset(1)
    with seeded_sampling(loaded, config.seed):
        stats = run_episodes(env, controller, config.episodes, seed=config.seed, on_episode_start=controller.reset_env)
    env.close()
    return stats


def evaluate(policy: Path, perturbation: str, twin: int, config: Sim2RealBenchConfig, logs: Path) -> Any:
    procs = nodes.start(
        {
            "sim_robot": {
                "robot": config.robot,
                "task": task_of(policy),
                "lockstep": True,
                "seed": twin,
                "perturbation": perturbation,
                "clock": True,  # stamps on the simulated time, which the deploy node judges them by
            },
            "deploy": {
                "robot": config.robot,
                "policy": str(policy),
                "trigger": "observation",
                "seed": config.seed,
                "wait_for_reset": True,
                "threads": config.threads,
                "use_sim_time": True,
            },
        },
        logs,
        config.domain,
    )
    try:
        return evaluate_over_ros(config.episodes, config.seed, episode_timeout=600.0)
    finally:
        nodes.stop(procs)


def main(config: Sim2RealBenchConfig) -> list[dict[str, Any]]:
    rows = []
    rclpy.init(domain_id=config.domain)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for item in config.policies:
                label, path = item.split("=", 1)
                nominal = None
                task = make(task_of(Path(path)), num_envs=1).task
                for name, perturbation, twin in [("in_process", "", 0), ("nominal", "none", 0)] + [
                    (f"twin{i}", "task", i) for i in range(config.twins)
                ]:
                    logs = Path(tmp) / f"{label}-{name}"
                    logs.mkdir()
                    start = time.perf_counter()
                    if perturbation:
                        stats = evaluate(Path(path), perturbation, twin, config, logs)
                    else:
                        stats = in_process(Path(path), config)
                    low, high = stats.success_ci95()
                    nominal = stats.success_rate if nominal is None and name == "nominal" else nominal
                    row = {
                        "bench": "sim2real",
                        "policy": label,
                        "robot": name,
                        "episodes": len(stats.success),
                        "success_rate": stats.success_rate,
                        "ci95": [round(low, 4), round(high, 4)],
                        "vs_nominal": round(stats.success_rate / nominal, 3) if nominal else None,
                        "measures": task.measures(stats),
                        "wall_s": round(time.perf_counter() - start, 1),
                    }
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    finally:
        rclpy.shutdown()
    return rows


if __name__ == "__main__":
    main(tyro.cli(Sim2RealBenchConfig))
