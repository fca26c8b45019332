"""Success classifier (issue 7): precision / recall / F1 on episodes it never saw, against baselines in the same run.

Records a training store and a separate test store (another seed) of the task's scripted expert at a noise where
about half the episodes fail, trains `robotrl train classifier` on the first (its threshold chosen on the first's
held-out episodes for `target_precision`), and scores every method on the test store's frames:

  classifier       the trained classifier at its chosen threshold
  classifier@0.5   the same network at the untuned 0.5 cut (balanced training moves its prior: see the module)
  step             success called from the step index alone, its cut the best-F1 one on the training frames
  majority         every frame called the training frames' majority class (a constant reward)

Frame-level metrics are what a reward sees each step; the episode-level ones ("any frame called success" against
the episode's recorded success) are what a success counter sees. Prints one JSON line per method, then a
summary line with the run's settings and times.

    .venv/bin/python bench/classifier.py                                    # PickPlace, front camera, 32 px
    .venv/bin/python bench/classifier.py --image-size 48 --episodes 120 --steps 4000

Its figures, with the machine and date: bench/RESULTS.md, "Success classifier: precision / recall of a learned
reward".
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import tyro

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.flowrl.classifier import (
    ClassifierConfig,
    Frames,
    Metrics,
    load,
    load_frames,
    majority_baseline,
    step_baseline,
    train,
)


@dataclass
class ClassifierBenchConfig:
    task: str = "PickPlace"
    camera: str = "front"
    image_size: int = 32
    noise: float = 0.8
    """expert noise of both stores (PickPlace at 0.8: about half the episodes fail)"""
    episodes: int = 60
    """training store episodes (a quarter of them held out for the threshold)"""
    test_episodes: int = 40
    episode_steps: int | None = 120
    steps: int = 2_000
    batch_size: int = 64
    target_precision: float = 0.9
    num_envs: int = 10
    seed: int = 0
    threads: int = 2
    out: Path | None = None
    """keep the stores and the run here (default: a temporary directory)"""


def row(method: str, scores: np.ndarray, threshold: float, frames: Frames, store: EpisodeStore) -> dict[str, object]:
    m = Metrics.of(scores, frames.labels, threshold)
    called = np.asarray(scores) >= threshold
    pred = np.array([called[frames.episode == e].any() for e in range(store.num_episodes)])
    truth = np.array([bool(e.get("success")) for e in store.episodes])
    tp = int((pred & truth).sum())
    return {
        "method": method,
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(m).items()},
        "episode_precision": round(tp / max(int(pred.sum()), 1), 4),
        "episode_recall": round(tp / max(int(truth.sum()), 1), 4),
        "episodes": store.num_episodes,
        "successful_episodes": int(truth.sum()),
    }


def main(config: ClassifierBenchConfig) -> None:
    root = Path(config.out or tempfile.mkdtemp(prefix="bench-classifier-"))
    options = {
        "image_size": config.image_size,
        **({"episode_steps": config.episode_steps} if config.episode_steps else {}),
    }
    t0 = time.perf_counter()
    stores = {}
    for name, episodes, seed in (
        ("train", config.episodes, config.seed),
        ("test", config.test_episodes, config.seed + 1000),
    ):
        path = root / f"{name}.zarr"
        if not path.exists():
            record_expert(
                path,
                config.task,
                episodes,
                num_envs=config.num_envs,
                noise=config.noise,
                seed=seed,
                progress=False,
                **options,
            ).close()
        stores[name] = EpisodeStore.open(path)
    record_s = time.perf_counter() - t0

    result = train(
        ClassifierConfig(
            store=root / "train.zarr",
            camera=config.camera,
            steps=config.steps,
            batch_size=config.batch_size,
            target_precision=config.target_precision,
            eval_every=0,
            checkpoint_every=config.steps,
            seed=config.seed,
            threads=config.threads,
            run_dir=root / "run",
            progress=False,
        )
    )
    clf = load(result.classifier)
    train_frames = load_frames(stores["train"], clf.net.camera).select(clf.metadata["labels"]["train_episodes"])
    test = load_frames(stores["test"], clf.net.camera)
    scores = clf.predict(test.images)
    step, majority = step_baseline(train_frames, test), majority_baseline(train_frames, test)
    constant = np.full(len(test.labels), float(majority.predicted > 0))  # the majority class, every frame
    for line in (
        row("classifier", scores, clf.threshold, test, stores["test"]),
        row("classifier@0.5", scores, 0.5, test, stores["test"]),
        row("step", test.step.astype(np.float64), step.threshold, test, stores["test"]),
        row("majority", constant, 0.5, test, stores["test"]),
    ):
        print(json.dumps(line), flush=True)
    print(
        json.dumps(
            {
                "summary": True,
                "task": config.task,
                "camera": clf.net.camera,
                "image_size": config.image_size,
                "noise": config.noise,
                "train_episodes": result.train_episodes,
                "threshold_episodes": result.heldout_episodes,
                "test_episodes": stores["test"].num_episodes,
                "steps": config.steps,
                "batch_size": config.batch_size,
                "target_precision": config.target_precision,
                "target_met_on_threshold_episodes": result.target_met,
                "threshold": round(clf.threshold, 4),
                "train_seconds": round(result.train_seconds, 1),
                "record_seconds": round(record_s, 1),
                "run_dir": str(result.run_dir),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(tyro.cli(ClassifierBenchConfig))
