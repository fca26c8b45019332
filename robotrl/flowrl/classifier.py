"""A success (reward) classifier from camera frames: HIL-SERL's learned reward, for envs (real robots) that give none.

    robotrl train classifier --store data/pp.zarr --camera front --steps 2000
    clf = robotrl.flowrl.classifier.load("runs/classifier-PickPlace-<time>/classifier"); p = clf.predict(images)
    env = ClassifierReward(make("PickPlace", num_envs=8), clf)   # reward 1 and success where p >= threshold

Reads top to bottom: labels (which stored frames show success) -> episode split -> the network (the policy library's
`ImageEncoder` + an MLP head, optionally proprioception) -> training (class-balanced batches, DrQ's random shift,
BCE) -> a threshold chosen on the held-out episodes for a target precision -> the checkpoint (safetensors +
manifest with the camera's spec, the threshold and the held-out precision / recall / F1) -> the reward wrapper.

Labels. A store's row t holds the observation the action was chosen from and the outcome of that action, so row
t's `success` describes the frame of row t + 1: frame t is positive when step t - 1 succeeded (frame 0 never is).
A successful episode whose steps carry no success flag (a teleoperator who only marked the episode) gets its last
`success_frames` frames as positives instead. Everything else, failed episodes and the frames before success, is
negative. The split is by episode (frames of one episode are near-duplicates), stratified by episode success.

Why a threshold for precision: a false positive pays the RL agent for a state that is not success, and it learns
to reach that state; a false negative only withholds a reward. Balanced batches move the network's prior to even
odds, so the raw 0.5 cut means nothing: the threshold is the lowest whose held-out precision reaches `target_precision`
(the most recall at that precision), or, where none does, the one with the best F0.5 (precision weighted over
recall), marked `target_met: false`. A held-out set that misses the target has confident false positives (on
PickPlace at 32 px: a cube just outside the bin, or on its wall), which no threshold removes: the cure is more
pixels or more such failures in the data (bench/classifier.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from robotrl.core.spec import ArraySpec, Spec, SpecMismatchError
from robotrl.datasets import EpisodeStore
from robotrl.policies.base import (
    CheckpointError,
    Normalizer,
    config_from_dict,
    load_weights,
    save_weights,
)
from robotrl.policies.nets import ImageEncoder, mlp, random_shift
from robotrl.training.loop import (
    RunLog,
    RunOptions,
    cosine_lr,
    jsonable,
    load_train_state,
    optimizer_step,
    rng_state,
    save_train_state,
    set_rng_state,
    start_run,
)

FORMAT = "robotrl-classifier"
VERSION = 1


# ---------------------------------------------------------------------------------------------------
# labels and the episode split
# ---------------------------------------------------------------------------------------------------
def frame_labels(step_success: np.ndarray, episode_success: bool, success_frames: int) -> np.ndarray:
    """Per stored frame of one episode: does it show success (module docstring)?"""
    n = len(step_success)
    labels = np.zeros(n, dtype=bool)
    step_success = np.asarray(step_success, dtype=bool)
    if step_success.any():
        labels[1:] = step_success[:-1]
    elif episode_success:
        labels[max(0, n - success_frames) :] = True
    return labels


def image_key(spec: Spec, camera: str, where: str = "camera") -> str:
    """The image observation named `camera`, as 'image_front' or just 'front'."""
    images = [k for k, v in spec.observations.items() if v.is_image]
    for key in (camera, f"image_{camera}"):
        if key in images:
            return key
    raise SpecMismatchError(
        f"{where}: expected one of the image observations {images} of task {spec.task!r}, got {camera!r}"
    )


@dataclass
class Frames:
    """The labelled frames of some episodes, in memory (uint8 images: 12 KiB a 64 px frame)."""

    images: np.ndarray
    """(N, H, W, 3) uint8"""
    proprio: dict[str, np.ndarray]
    labels: np.ndarray
    """(N,) bool"""
    episode: np.ndarray
    """(N,) the store's episode index of each frame"""
    step: np.ndarray
    """(N,) the frame's step within its episode"""

    def select(self, episodes: Sequence[int]) -> Frames:
        keep = np.isin(self.episode, np.asarray(episodes, dtype=np.int64))
        return Frames(
            self.images[keep],
            {k: v[keep] for k, v in self.proprio.items()},
            self.labels[keep],
            self.episode[keep],
            self.step[keep],
        )


def load_frames(store: EpisodeStore, camera: str, proprio: Sequence[str] = (), success_frames: int = 10) -> Frames:
    """Every committed frame of `camera` (an image key) in `store`, labelled."""
    data = store.load([camera, "success", *proprio])
    starts, ends = store.episode_starts, store.episode_ends
    labels = (
        np.concatenate(
            [
                frame_labels(data["success"][s:e], bool(meta.get("success")), success_frames)
                for s, e, meta in zip(starts, ends, store.episodes)
            ]
        )
        if len(ends)
        else np.zeros(0, bool)
    )
    lengths = ends - starts
    episode = np.repeat(np.arange(len(ends)), lengths)
    step = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(starts, lengths)
    return Frames(data[camera], {k: data[k] for k in proprio}, labels, episode, step)


def split_episodes(frames: Frames, holdout: float, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """(train, held-out) episodes, `holdout` of those with a positive frame and of those without on each side
    (at least one of each kind held out when there are two), so both sides see both classes."""
    positive = np.unique(frames.episode[frames.labels])
    negative = np.setdiff1d(np.unique(frames.episode), positive)
    train, held = [], []
    for group in (positive, negative):
        group = rng.permutation(group)
        k = min(len(group) - 1, max(1, round(holdout * len(group)))) if len(group) > 1 else 0
        held += group[:k].tolist()
        train += group[k:].tolist()
    return sorted(train), sorted(held)


# ---------------------------------------------------------------------------------------------------
# metrics, the threshold and the baselines
# ---------------------------------------------------------------------------------------------------
@dataclass
class Metrics:
    """Frame-level precision / recall / F1 of a decision rule on labelled frames."""

    precision: float
    recall: float
    f1: float
    threshold: float
    frames: int
    positives: int
    predicted: int

    @classmethod
    def of(cls, scores: np.ndarray, labels: np.ndarray, threshold: float) -> Metrics:
        pred = np.asarray(scores) >= threshold
        labels = np.asarray(labels, dtype=bool)
        tp = int((pred & labels).sum())
        precision = tp / int(pred.sum()) if pred.any() else 0.0  # no positive calls: no precision to claim
        recall = tp / int(labels.sum()) if labels.any() else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
        return cls(precision, recall, f1, float(threshold), len(labels), int(labels.sum()), int(pred.sum()))


def choose_threshold(
    scores: np.ndarray, labels: np.ndarray, target_precision: float | None, beta: float = 0.5
) -> tuple[float, bool]:
    """(threshold, whether it reaches `target_precision`): the lowest threshold with that precision, else (or with
    no target) the best F-beta one. Candidates are the scores themselves (every distinct decision): it is exact."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    s, y = np.asarray(scores, dtype=np.float64)[order], np.asarray(labels, dtype=bool)[order]
    if not y.any():
        raise ValueError("choose_threshold: expected held-out frames with at least one positive, got none")
    last = np.r_[s[1:] != s[:-1], True]  # calling every frame down to a run of equal scores positive
    tp = np.cumsum(y)[last]
    called = np.flatnonzero(last) + 1
    precision, recall, cut = tp / called, tp / y.sum(), s[last]
    ok: np.ndarray | list[int] = np.flatnonzero(precision >= target_precision) if target_precision is not None else []
    if len(ok):
        return float(cut[ok[-1]]), True
    b2 = beta * beta
    fbeta = (1 + b2) * precision * recall / np.maximum(b2 * precision + recall, 1e-12)
    return float(cut[int(np.argmax(fbeta))]), False


def majority_baseline(train: Frames, held: Frames) -> Metrics:
    """Every frame called the training frames' majority class: what a constant reward gets."""
    call = float(train.labels.mean() >= 0.5)
    return Metrics.of(np.full(len(held.labels), call), held.labels, 0.5)


def step_baseline(train: Frames, held: Frames) -> Metrics:
    """Success called from the step index alone (success comes late in an episode), its cut the best-F1 one on
    the training frames: the reward a timer would give, which a camera must beat."""
    cut, _ = choose_threshold(train.step.astype(np.float64), train.labels, None, beta=1.0)
    return Metrics.of(held.step, held.labels, cut)


# ---------------------------------------------------------------------------------------------------
# the network and its checkpoint
# ---------------------------------------------------------------------------------------------------
@dataclass
class ClassifierNet:
    """The classifier's architecture (saved in its manifest)."""

    camera: str = "image_front"
    proprio: tuple[str, ...] = ()
    widths: tuple[int, ...] = (16, 32, 64)
    encoder_dim: int = 64
    hidden: tuple[int, ...] = (256,)


class SuccessClassifier(nn.Module):
    """Camera frame (+ optional proprioception) -> logit of success. `predict` gives probabilities and
    `threshold` (set from held-out data) turns them into a reward."""

    def __init__(
        self,
        net: ClassifierNet,
        inputs: Mapping[str, ArraySpec],
        stats: Mapping[str, Any] | None = None,
        threshold: float = 0.5,
        task: str = "",
    ) -> None:
        super().__init__()
        missing = [k for k in (net.camera, *net.proprio) if k not in inputs]
        if missing:
            raise SpecMismatchError(f"classifier inputs: {missing} missing; have {sorted(inputs)}")
        if not inputs[net.camera].is_image:
            raise SpecMismatchError(
                f"classifier camera {net.camera!r}: expected an (H, W, 3) uint8 image, got "
                f"{inputs[net.camera].shape} {inputs[net.camera].dtype}"
            )
        self.net, self.threshold, self.task = net, float(threshold), task
        self.inputs = {k: inputs[k] for k in (net.camera, *net.proprio)}
        self.stats = {k: {n: np.asarray(v).tolist() for n, v in s.items()} for k, s in (stats or {}).items()}
        self.encoder = ImageEncoder(self.inputs[net.camera].shape[0], net.encoder_dim, net.widths, crop=1.0)
        self.normalizer = Normalizer({k: self.inputs[k].shape for k in net.proprio}, stats)
        width = net.encoder_dim + sum(self.inputs[k].size for k in net.proprio)
        self.head = mlp([width, *net.hidden, 1], act=nn.Mish, layer_norm=True)
        self.metadata: dict[str, Any] = {}

    def forward(self, images: torch.Tensor, proprio: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Logits (N,) of images (N, H, W, 3) in [0, 1] and raw proprioception (N, ...) per key."""
        parts = [self.encoder(images)]
        for k in self.net.proprio:
            parts.append(self.normalizer.normalize(k, (proprio or {})[k].float()).flatten(1))
        return self.head(torch.cat(parts, dim=-1)).squeeze(-1)

    def check(self, spec: Spec, that: str = "env") -> None:
        """Refuse a spec (an env's, a store's) whose inputs differ from the classifier's, naming the key."""
        for key, want in self.inputs.items():
            have = spec.observations.get(key)
            if have is None or have.to_dict() != want.to_dict():
                raise SpecMismatchError(
                    f"classifier input {key!r}: expected {want.to_dict()}, {that} {spec.task!r} "
                    f"has {have.to_dict() if have is not None else 'no such observation'}"
                )

    def _batch(self, key: str, x: Any) -> torch.Tensor:
        x = x.detach().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
        want = self.inputs[key]
        if tuple(x.shape[1:]) != want.shape or x.ndim != len(want.shape) + 1:
            raise SpecMismatchError(
                f"classifier.predict: {key!r}: expected shape (N, {', '.join(map(str, want.shape))}), "
                f"got {tuple(x.shape)}"
            )
        if key == self.net.camera and x.dtype != torch.uint8:
            raise SpecMismatchError(f"classifier.predict: {key!r}: expected uint8 images (0-255), got {x.dtype}")
        return x

    @torch.no_grad()
    def predict(self, images: Any, proprio: Mapping[str, Any] | None = None, batch_size: int = 512) -> np.ndarray:
        """Success probabilities (N,) of uint8 images (N, H, W, 3) (numpy or torch), and of the proprioception
        the classifier was trained with, if any."""
        x = self._batch(self.net.camera, images)
        proprio = proprio or {}
        absent = [k for k in self.net.proprio if proprio.get(k) is None]
        if absent:
            raise SpecMismatchError(
                f"classifier.predict: proprioception {absent} missing (trained with {list(self.net.proprio)})"
            )
        extra = {k: self._batch(k, proprio[k]) for k in self.net.proprio}
        device = next(self.parameters()).device
        was = self.training
        self.eval()
        out = []
        for i in range(0, len(x), batch_size):
            chunk = {k: v[i : i + batch_size].to(device) for k, v in extra.items()}
            out.append(torch.sigmoid(self(x[i : i + batch_size].to(device).float() / 255.0, chunk)).cpu())
        self.train(was)
        return torch.cat(out).numpy() if out else np.zeros(0, np.float32)

    def manifest(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "task": self.task,
            "config": asdict(self.net),
            "inputs": {k: v.to_dict() for k, v in self.inputs.items()},
            "stats": self.stats,
            "threshold": self.threshold,
            **self.metadata,
        }

    def save(self, path: str | Path) -> Path:
        return save_weights(path, self.state_dict(), self.manifest(), FORMAT)


def load(path: str | Path, device: str = "cpu") -> SuccessClassifier:
    """The classifier saved at `path`: weights verified against the manifest's hash, nothing unpickled."""
    from robotrl.core.files import MANIFEST, read_manifest

    path = Path(path)
    manifest = read_manifest(
        path, CheckpointError, "a robotrl classifier", ("format", "config", "inputs", "threshold", "weights_sha256")
    )
    if manifest["format"] != FORMAT:
        raise CheckpointError(f"{path / MANIFEST}: format: expected {FORMAT!r}, got {manifest['format']!r}")
    if int(manifest.get("version", -1)) > VERSION:
        raise CheckpointError(
            f"{path / MANIFEST}: version {manifest.get('version')} is newer than this robotrl ({VERSION})"
        )
    net = config_from_dict(ClassifierNet, manifest["config"], str(path / MANIFEST))  # type: ignore[arg-type]
    inputs = {k: ArraySpec.from_dict(v) for k, v in manifest["inputs"].items()}
    stats = {k: {n: np.asarray(v) for n, v in s.items()} for k, s in manifest.get("stats", {}).items()}
    model = SuccessClassifier(net, inputs, stats or None, manifest["threshold"], manifest.get("task", ""))  # type: ignore[arg-type]
    state = load_weights(path, manifest, device)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(
            f"{path}: weights do not fit the manifest's config: {str(e).splitlines()[-1].strip()}"
        ) from None
    model.metadata = {k: v for k, v in manifest.items() if k not in model.manifest() and k != "weights_sha256"}
    return model.to(device).eval()


# ---------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------
@dataclass
class ClassifierConfig(RunOptions):
    """Train a success classifier on a store's camera frames (successful and failed episodes), for a reward."""

    store: Path = Path("data/pusht.zarr")
    """episodes with camera frames, successful and failed (e.g. `robotrl data record --images`)"""
    camera: str = "image_top"
    """the image observation ('image_top' or 'top': PushT's overhead camera; PickPlace's: 'front', 'wrist')"""
    proprio: tuple[str, ...] = ()
    """vector observations also fed to the classifier (default none: the camera alone, as HIL-SERL)"""
    steps: int = 2_000
    batch_size: int = 64
    """frames per batch, half successes and half not"""
    lr: float = 3e-4
    weight_decay: float = 1e-4
    warmup: int = 100
    augment_pad: int = 4
    """DrQ random shift in pixels (0: none)"""
    encoder_widths: tuple[int, ...] = (16, 32, 64)
    """the image encoder's ResNet stage widths"""
    encoder_dim: int = 64
    hidden: tuple[int, ...] = (256,)
    holdout: float = 0.25
    """fraction of the episodes (of the successful and of the failed ones each) held out for the threshold and the
    reported precision / recall"""
    target_precision: float = 0.9
    success_frames: int = 10
    """k: a successful episode without per-step success flags has its last k frames labelled positive"""
    eval_every: int = 500
    """held-out metrics every N steps (0: only at the end)"""
    checkpoint_every: int = 500
    """gradient steps between train states"""
    log_every: int = 50
    """gradient steps between metrics rows"""
    threads: int = 2
    """torch CPU threads (the image encoder's convolutions use a second core)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.store = Path(self.store)
        self.proprio, self.encoder_widths = tuple(self.proprio), tuple(self.encoder_widths)
        self.hidden = tuple(self.hidden)
        for name in ("steps", "batch_size", "success_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"ClassifierConfig.{name}: expected >= 1, got {getattr(self, name)}")
        for name in ("augment_pad", "warmup"):
            if getattr(self, name) < 0:
                raise ValueError(f"ClassifierConfig.{name}: expected >= 0, got {getattr(self, name)}")
        if self.batch_size < 2:
            raise ValueError(
                f"ClassifierConfig.batch_size: expected >= 2 (half positive, half negative), got {self.batch_size}"
            )
        if not 0.0 < self.holdout < 1.0:
            raise ValueError(f"ClassifierConfig.holdout: expected a fraction in (0, 1), got {self.holdout}")
        if not 0.0 < self.target_precision <= 1.0:
            raise ValueError(
                f"ClassifierConfig.target_precision: expected a value in (0, 1], got {self.target_precision}"
            )


@dataclass
class ClassifierResult:
    """What a classifier run ends with; also its run directory's result.json."""

    classifier: Path
    steps: int
    train_seconds: float
    heldout: Metrics
    target_met: bool
    baselines: dict[str, Metrics]
    train_episodes: int
    heldout_episodes: int
    run_dir: Path


def _scores(model: SuccessClassifier, frames: Frames) -> np.ndarray:
    return model.predict(frames.images, frames.proprio)


def train(config: ClassifierConfig) -> ClassifierResult:
    store = EpisodeStore.open(config.store)
    spec = store.spec
    camera = image_key(spec, config.camera, "ClassifierConfig.camera")
    unknown = [
        k
        for k in config.proprio
        if k not in spec.observations or spec.observations[k].is_image or spec.observations[k].dtype == "str"
    ]
    if unknown:
        vectors = [k for k, v in spec.observations.items() if not v.is_image and v.dtype != "str"]
        raise SpecMismatchError(
            f"ClassifierConfig.proprio: expected some of the vector observations {vectors}, got {unknown}"
        )
    run_dir, state_path, rng = start_run(config, "classifier", spec.task)

    # data: labelled frames, split by episode
    frames = load_frames(store, camera, config.proprio, config.success_frames)
    succeeded = len(np.unique(frames.episode[frames.labels]))
    if succeeded < 2 or store.num_episodes - succeeded < 2:
        raise ValueError(
            f"ClassifierConfig.store: expected at least 2 episodes with success frames and 2 without "
            f"(to train on and to hold out), got {succeeded} and {store.num_episodes - succeeded} in "
            f"{config.store}"
        )
    train_eps, held_eps = split_episodes(frames, config.holdout, rng)
    train_set, held = frames.select(train_eps), frames.select(held_eps)
    positives, negatives = np.flatnonzero(train_set.labels), np.flatnonzero(~train_set.labels)

    # network, optimizer, schedule
    net = ClassifierNet(camera, config.proprio, config.encoder_widths, config.encoder_dim, config.hidden)
    stats = {k: v for k, v in store.stats().items() if k in config.proprio}
    model = SuccessClassifier(net, {k: spec.observations[k] for k in (camera, *config.proprio)}, stats, task=spec.task)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_lr(s, config.steps, max(config.warmup, 1)))
    start = 0
    if config.resume:
        state = load_train_state(state_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        set_rng_state(state["rng"], rng)
        start = state["step"]

    log = RunLog(run_dir)
    bar = tqdm(
        total=config.steps,
        initial=start,
        desc=f"classifier {spec.task}",
        unit="step",
        disable=not config.progress,
        dynamic_ncols=True,
    )
    began = time.perf_counter()
    half = config.batch_size // 2
    model.train()
    for step in range(start, config.steps):
        idx = np.concatenate([rng.choice(positives, half), rng.choice(negatives, config.batch_size - half)])
        target = torch.as_tensor(train_set.labels[idx], dtype=torch.float32)
        images = random_shift(torch.from_numpy(train_set.images[idx]).float() / 255.0, config.augment_pad)
        logits = model(images, {k: torch.from_numpy(v[idx]) for k, v in train_set.proprio.items()})
        loss = F.binary_cross_entropy_with_logits(logits, target)
        value, grad_norm = optimizer_step(
            loss, model, optimizer, schedule, f"classifier step {step} (last train state: {state_path})"
        )
        done = step + 1
        bar.update(1)
        if done % config.log_every == 0 or done == config.steps:
            accuracy = float(((logits.detach() > 0) == (target > 0.5)).float().mean())
            log.log(
                done,
                **{
                    "train/loss": value,
                    "train/accuracy": accuracy,
                    "train/grad_norm": grad_norm,
                    "train/lr": schedule.get_last_lr()[0],
                },
            )
            bar.set_postfix(loss=f"{value:.3f}")
        if done % config.checkpoint_every == 0 and done != config.steps:
            save_train_state(
                state_path,
                step=done,
                model=model.state_dict(),
                optimizer=optimizer.state_dict(),
                schedule=schedule.state_dict(),
                rng=rng_state(rng),
            )
        if config.eval_every and done % config.eval_every == 0 and done != config.steps:
            m = Metrics.of(_scores(model, held), held.labels, 0.5)
            log.log(
                done, **{"heldout/precision@0.5": m.precision, "heldout/recall@0.5": m.recall, "heldout/f1@0.5": m.f1}
            )
    bar.close()
    seconds = time.perf_counter() - began
    save_train_state(
        state_path,
        step=config.steps,
        model=model.state_dict(),
        optimizer=optimizer.state_dict(),
        schedule=schedule.state_dict(),
        rng=rng_state(rng),
    )

    # the threshold and the held-out report, against the baselines on the same frames
    scores = _scores(model, held)
    threshold, met = choose_threshold(scores, held.labels, config.target_precision)
    metrics = Metrics.of(scores, held.labels, threshold)
    baselines = {"majority": majority_baseline(train_set, held), "step": step_baseline(train_set, held)}
    model.threshold = threshold
    model.metadata = {
        "target_precision": config.target_precision,
        "target_met": met,
        "heldout": asdict(metrics),
        "baselines": {k: asdict(v) for k, v in baselines.items()},
        "labels": {
            "success_frames": config.success_frames,
            "store": str(config.store),
            "train_episodes": train_eps,
            "heldout_episodes": held_eps,
        },
    }
    path = model.save(run_dir / "classifier")
    log.log(
        config.steps,
        **{f"heldout/{k}": getattr(metrics, k) for k in ("precision", "recall", "f1", "threshold")},
        **{f"baseline_{n}/{k}": getattr(b, k) for n, b in baselines.items() for k in ("precision", "recall", "f1")},
    )
    log.close()
    result = ClassifierResult(
        path, config.steps, seconds, metrics, met, baselines, len(train_eps), len(held_eps), run_dir
    )
    (run_dir / "result.json").write_text(json.dumps(jsonable(result), indent=2))
    return result


def run_train_classifier(config: ClassifierConfig) -> ClassifierResult:
    r = train(config)
    m, step = r.heldout, r.baselines["step"]
    met = "" if r.target_met else f" (target precision {config.target_precision} not reached: best-F0.5 threshold)"
    print(
        f"classifier: held-out precision {m.precision:.1%} recall {m.recall:.1%} F1 {m.f1:.3f} at threshold "
        f"{m.threshold:.3f}{met} on {m.frames} frames of {r.heldout_episodes} episodes; step-index baseline "
        f"precision {step.precision:.1%} recall {step.recall:.1%} F1 {step.f1:.3f}; {r.steps} steps in "
        f"{r.train_seconds:.0f} s; classifier {r.classifier}"
    )
    return r


# ---------------------------------------------------------------------------------------------------
# the classifier as the reward
# ---------------------------------------------------------------------------------------------------
def classifier_reward(
    classifier: SuccessClassifier, obs: Mapping[str, Any], info: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(reward, success, probability) per env for a vector-env step: the frame each step reached, which for an env
    that just auto-reset is `info['final_obs']`, not the new episode's first frame."""
    keys = (classifier.net.camera, *classifier.net.proprio)
    reached = {k: np.array(obs[k].cpu() if isinstance(obs[k], torch.Tensor) else obs[k]) for k in keys}
    if "final_obs" in info:
        done = np.asarray(
            info["_final_obs"].cpu() if isinstance(info["_final_obs"], torch.Tensor) else info["_final_obs"]
        )
        for k in keys:
            final = info["final_obs"][k]
            reached[k][done] = np.asarray(final.cpu() if isinstance(final, torch.Tensor) else final)[done]
    p = classifier.predict(reached[classifier.net.camera], {k: reached[k] for k in classifier.net.proprio})
    success = p >= classifier.threshold
    return success.astype(np.float64), success, p


class ClassifierReward:
    """Any robotrl vector env (same-step auto-reset, `info['final_obs']`) with its reward and `info['success']`
    replaced by the classifier's: reward 1 and success where p >= threshold, else 0. The env's own success, if
    any, stays in `info['env_success']` (for checking the classifier, never for learning); `info['classifier_p']`
    holds the probabilities. Every other attribute is the env's."""

    def __init__(self, env: Any, classifier: SuccessClassifier) -> None:
        classifier.check(env.task_spec, "env")
        self.env, self.classifier = env, classifier

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict]:
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: Any) -> tuple[dict[str, Any], Any, Any, Any, dict[str, Any]]:
        obs, env_reward, terminated, truncated, info = self.env.step(actions)
        reward, success, p = classifier_reward(self.classifier, obs, info)
        info = {**info, "env_success": info.get("success"), "success": success, "classifier_p": p}
        if isinstance(env_reward, torch.Tensor):
            return obs, torch.as_tensor(reward, dtype=env_reward.dtype), terminated, truncated, info
        return obs, reward, terminated, truncated, info

    def close(self, **kwargs: Any) -> None:
        self.env.close(**kwargs)
