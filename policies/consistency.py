"""One-step consistency policy (RL-100's deployment head): a student with its teacher's architecture (or a
narrower U-Net), distilled
from a flow or diffusion teacher so that one network call from pure noise gives the chunk the teacher's ODE
solver would give after many.

The teacher's sampler visits a fixed grid of N + 1 points, point 0 pure noise, point N the clean chunk:

    flow       time t_i = i / N,  x_i = (1 - t_i) noise + t_i chunk,     one Euler (or Heun) step per point
    diffusion  the DDIM grid k_0 = train_steps - 1 > ... > k_{N-1} = 0, then the clean point (alpha-bar = 1),
               x_i = sqrt(ab_i) chunk + sqrt(1 - ab_i) noise,            one deterministic DDIM step per point
               (a teacher that samples with DDPM is distilled along this ODE of the same network)

The student f(x_i, i, obs) maps any point of a teacher trajectory to that trajectory's end. It is
parametrised so that the boundary condition f(x_N, N) = x_N holds exactly, whatever the weights:

    flow       f = x + (1 - t) F(x, t, obs)                               (c_skip = 1, c_out = 1 - t)
    diffusion  f = sqrt(ab) x - sqrt(1 - ab) F(x, k, obs)                 (c_skip = sqrt(ab), c_out = -sqrt(1 - ab))

with F the U-Net, initialised from the teacher's weights (`from_teacher`; a narrower student's starts fresh). For a
flow teacher F starts as the teacher's velocity, so the untrained student is the teacher's one-step Euler sampler. For
a diffusion teacher F is a v-prediction (v = sqrt(ab) eps - sqrt(1 - ab) chunk): the teacher's eps-parametrisation
would divide by sqrt(ab) ~ 5e-4 at the noisiest point, which no training can condition; v equals eps at low noise, so
the teacher's weights are a good start there and the features are reused everywhere. Consistency distillation (Song et
al. 2023) then trains f(x_i, i) towards the target network's f(x_{i+1}, i + 1), where x_{i+1} is one teacher ODE step
from x_i and the target is an EMA of the student (`distill_loss`; the loop is `robotrl.stages.distill`).

A VLA teacher (pi0's layout: a prefix "VLM" and a flow action expert) is a flow teacher with other networks:
`VLAConsistencyPolicy` is the same student over the VLA's own prefix and expert, starting from its weights, so
the RL'd VLA gets a one-step head too (`student_for` picks the student class for a teacher).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from robotrl.core.spec import Spec, SpecMismatchError
from robotrl.policies.base import register, register_all
from robotrl.policies.diffusion import DiffusionPolicy, cosine_alphas_cumprod
from robotrl.policies.generative import GenerativeConfig, GenerativePolicy
from robotrl.policies.vla import VLAConfig, VLAPolicy


def teachers() -> list[str]:
    """The registered policies that are distilled into a student (their class names it: `Policy.student`)."""
    return sorted(name for name, cls in register_all().items() if cls.student is not None)


def ode_kind(teacher: Any) -> str | None:
    """Which ODE grid a teacher's sampler walks: 'flow' (a `FlowPolicy`, the VLA among them), 'diffusion' (a
    `DiffusionPolicy`'s DDIM grid), or None."""
    from robotrl.policies.flow import FlowPolicy

    return "flow" if isinstance(teacher, FlowPolicy) else "diffusion" if isinstance(teacher, DiffusionPolicy) else None


def check_grid(config: Any) -> None:
    """The grid fields every student config has (`teacher_steps`, `teacher_solver`), named in its errors."""
    name = type(config).__name__
    if config.teacher_solver not in ("euler", "heun"):
        raise ValueError(f"{name}.teacher_solver: expected 'euler' or 'heun', got {config.teacher_solver!r}")
    if config.teacher_steps < 1:
        raise ValueError(f"{name}.teacher_steps: expected >= 1, got {config.teacher_steps}")


@dataclass
class ConsistencyConfig(GenerativeConfig):
    teacher: str = "flow"
    """the teacher's policy type: 'flow' or 'diffusion' (fixes the student's time input and parametrisation)"""
    teacher_steps: int = 10
    """N: points of the teacher's ODE grid the student is distilled on (the teacher's own sampler steps)"""
    teacher_solver: str = "euler"
    """flow teacher: 'euler' or 'heun' steps along the grid"""
    train_steps: int = 100
    """diffusion teacher: length of its noise schedule"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.teacher not in ("flow", "diffusion"):
            raise ValueError(
                f"ConsistencyConfig.teacher: expected 'flow' or 'diffusion' (a VLA's student is "
                f"VLAConsistencyPolicy), got {self.teacher!r}"
            )
        check_grid(self)
        if self.teacher == "diffusion" and self.teacher_steps > self.train_steps:
            raise ValueError(
                f"ConsistencyConfig.teacher_steps: expected <= train_steps ({self.train_steps}) for a "
                f"diffusion teacher, got {self.teacher_steps}"
            )


class ConsistencyHead:
    """The consistency student's grid, parametrisation, distillation loss and one-call sampler, written once
    for any teacher architecture. The class it is mixed into supplies `encoder(obs) -> cond`,
    `net(x, time, cond)`, `horizon`, `pad_chunk`, `masked_mse` and `noise` (a `GenerativePolicy` or a
    `VLAPolicy`), `teacher_kind` ('flow' or 'diffusion': which ODE grid) and the config's `teacher_steps` and
    `teacher_solver`."""

    teacher_kind: str
    #: the kind of teacher this student is distilled from, as its errors name it
    teacher_name: str
    config: Any
    times: torch.Tensor
    alpha_bar: torch.Tensor
    #: the teacher config's fields the student must share (architecture, windows, observations)
    shared_config: type

    def init_grid(self, train_steps: int = 0) -> None:
        n = self.config.teacher_steps
        if self.teacher_kind == "flow":
            times = torch.arange(n + 1, dtype=torch.float32) / n
            alpha_bar = torch.zeros(n + 1)  # unused
        else:
            ks = torch.linspace(train_steps - 1, 0, n).round()  # DiffusionPolicy's DDIM grid
            times = torch.cat([ks, torch.tensor([-1.0])])  # the clean point's time is never seen by the network
            alpha_bar = torch.cat([cosine_alphas_cumprod(train_steps)[ks.long()], torch.ones(1)])
        self.register_buffer("times", times, persistent=False)  # type: ignore[attr-defined]
        self.register_buffer("alpha_bar", alpha_bar, persistent=False)  # type: ignore[attr-defined]

    def check_teacher(self, teacher: Any) -> None:
        """Refuse a teacher this student was not built for (type, spec, windows, architecture): a teacher whose
        class names this student (`Policy.student`), on this student's ODE grid."""
        if teacher.student != self.name or ode_kind(teacher) != self.teacher_kind:  # type: ignore[attr-defined]
            raise TypeError(f"{self.name}: built for a {self.teacher_name!r} teacher, got {teacher.name!r}")  # type: ignore[attr-defined]
        teacher.spec.check(self.spec, this="teacher", that=f"{self.name} student")  # type: ignore[attr-defined]
        for f in dataclasses.fields(self.shared_config):
            mine, theirs = getattr(self.config, f.name), getattr(teacher.config, f.name)
            if mine != theirs and not (f.name == "channels" and len(mine) == len(theirs)):
                raise SpecMismatchError(
                    f"{self.name} student: config.{f.name} is {mine!r} but the teacher's is "  # type: ignore[attr-defined]
                    f"{theirs!r}; build the student with student_for(teacher)"
                )

    # --- the trajectory grid -----------------------------------------------------------------------
    def _at(self, values: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return values[i][:, None, None]

    def point(self, chunk: torch.Tensor, noise: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        """x_i: the chunk noised to grid point i (the forward process the teacher was trained on)."""
        if self.teacher_kind == "flow":
            t = self._at(self.times, i)
            return (1 - t) * noise + t * chunk
        ab = self._at(self.alpha_bar, i)
        return ab.sqrt() * chunk + (1 - ab).sqrt() * noise

    def consistency(self, x: torch.Tensor, i: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """f(x, i, obs): the end of the teacher trajectory through x at grid point i (i = N returns x itself)."""
        out = self.net(x, self.times[i], cond)  # type: ignore[attr-defined]
        if self.teacher_kind == "flow":
            return x + (1 - self._at(self.times, i)) * out
        ab = self._at(self.alpha_bar, i)
        return ab.sqrt() * x - (1 - ab).sqrt() * out

    @torch.no_grad()
    def teacher_step(self, teacher: Any, x: torch.Tensor, i: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """One step of the teacher's sampler from grid point i to i + 1 (`cond` from the teacher's encoder)."""
        if self.teacher_kind == "flow":
            t, t_next = self.times[i], self.times[i + 1]
            dt = (t_next - t)[:, None, None]
            v = teacher.net(x, t, cond)
            if self.config.teacher_solver == "heun":
                v = 0.5 * (v + teacher.net(x + dt * v, t_next, cond))
            return x + dt * v
        # deterministic DDIM (eta = 0), with DiffusionPolicy.sample's clamp of the clean-chunk estimate
        ab, ab_next = self._at(self.alpha_bar, i), self._at(self.alpha_bar, i + 1)
        eps = teacher.net(x, self.times[i], cond)
        x0 = ((x - (1 - ab).sqrt() * eps) / ab.sqrt()).clamp(-1.5, 1.5)
        return ab_next.sqrt() * x0 + (1 - ab_next).sqrt() * eps

    @torch.no_grad()
    def teacher_solve(
        self, teacher: Any, noise: torch.Tensor, obs: dict[str, torch.Tensor], cond: Any = None
    ) -> torch.Tensor:
        """The teacher's multi-step answer from `noise` along the grid (what the student's one step should give);
        the student's horizon (B, horizon, A), normalized. `cond`: the teacher's encoding of `obs`, where the
        caller has it already."""
        cond = teacher.encoder(obs) if cond is None else cond
        x = noise
        for step in range(self.config.teacher_steps):
            x = self.teacher_step(teacher, x, torch.full((x.shape[0],), step, device=x.device), cond)
        return x

    @torch.no_grad()
    def teacher_chunk(self, teacher: Any, noise: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The chunk the teacher's own sampler draws from standard normal `noise` (B, noise_rows, A) (its noise
        prior and chunk residual applied, if it has them): what `sample_from_noise` is distilled to give, (B, H,
        A) normalized."""
        x = self.teacher_solve(teacher, teacher.initial_noise(obs, noise), obs)
        return teacher.refine(obs, x[:, : self.config.action_horizon], noise)

    # --- training and sampling -----------------------------------------------------------------------
    def loss(self, obs: dict[str, torch.Tensor], action: torch.Tensor, action_is_pad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(
            f"{type(self).__name__} is trained by distillation from a teacher: use "
            "distill_loss(teacher, target, obs, action, action_is_pad) (robotrl.stages.distill does), "
            "not loss()"
        )

    def distill_loss(
        self,
        teacher: Any,
        target: Any,
        obs: dict[str, torch.Tensor],
        action: torch.Tensor,
        action_is_pad: torch.Tensor,
        solve_weight: float = 0.0,
    ) -> torch.Tensor:
        """Consistency-distillation loss on a normalized batch: ||f(x_i, i) - f_target(x_{i+1}, i + 1)||^2 with
        x_i the chunk noised to a random grid point and x_{i+1} one teacher step further (no gradient to the
        teacher or the target; at i + 1 = N the target is the teacher's step itself). The noise is drawn where the
        teacher starts its sampler: under its noise prior, if it has one (an RL-steered teacher).

        `solve_weight` > 0 adds, with that weight, ||f(x_0, 0) - teacher ODE(x_0)||^2 from the same noise x_0: the one
        call the student makes when deployed, regressed onto the teacher's whole N-step solve (Luhman & Luhman's
        direct distillation). Consistency training reaches point 0 only through the chain of its targets, one
        grid step at a time, and trains it on 1/N of a batch; the direct term trains it on every row, at the cost
        of N teacher calls a batch."""
        chunk, mask = self.pad_chunk(action, action_is_pad)  # type: ignore[attr-defined]
        with torch.no_grad():
            noise = teacher.initial_noise(obs, torch.randn_like(chunk))
        i = torch.randint(0, self.config.teacher_steps, (chunk.shape[0],), device=chunk.device)
        x = self.point(chunk, noise, i)
        with torch.no_grad():
            teacher_cond = teacher.encoder(obs)
            x_next = self.teacher_step(teacher, x, i, teacher_cond)
            y = target.consistency(x_next, i + 1, target.encoder(obs))
        cond = self.encoder(obs)  # type: ignore[attr-defined]
        loss = self.masked_mse(self.consistency(x, i, cond), y, mask)  # type: ignore[attr-defined]
        if solve_weight:
            solved = self.teacher_solve(teacher, noise, obs, teacher_cond)
            start = self.consistency(noise, torch.zeros_like(i), cond)
            loss = loss + solve_weight * self.masked_mse(start, solved, mask)  # type: ignore[attr-defined]
        return loss

    def compute_distill_loss(
        self, batch: Mapping[str, Any], teacher: Any, target: Any, solve_weight: float = 0.0
    ) -> torch.Tensor:
        """`distill_loss` of a `SequenceSampler` batch (raw units; normalized with the student's statistics,
        which are the teacher's)."""
        device = next(self.parameters()).device  # type: ignore[attr-defined]
        obs = self.normalize_obs(batch["obs"])  # type: ignore[attr-defined]
        action = self.normalizer.normalize("action", torch.as_tensor(batch["action"], device=device).float())  # type: ignore[attr-defined]
        pad = torch.as_tensor(batch["action_is_pad"], device=device)
        return self.distill_loss(teacher, target, obs, action, pad, solve_weight)

    def sample_from_noise(self, obs: dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        """One network call: f(x_0, 0, obs) from x_0 the initial noise for standard normal `noise` (B, noise_rows,
        A) (under the teacher's noise prior, and plus its chunk residual, where it has them); deterministic given
        the noise (what export traces)."""
        i = torch.zeros(noise.shape[0], dtype=torch.long, device=noise.device)
        x0 = self.initial_noise(obs, noise)  # type: ignore[attr-defined]
        chunk = self.consistency(x0, i, self.encoder(obs))[:, : self.config.action_horizon]  # type: ignore[attr-defined]
        return self.refine(obs, chunk, noise)  # type: ignore[attr-defined]

    def sample(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = next(iter(obs.values())).shape[0]
        return self.sample_from_noise(obs, self.noise(batch, next(self.parameters()).device))  # type: ignore[attr-defined]


@register
class ConsistencyPolicy(ConsistencyHead, GenerativePolicy):
    """One U-Net call per chunk, distilled from a flow or diffusion teacher (see the module docstring)."""

    name = "consistency"
    config_cls = ConsistencyConfig
    learns_from_data = False
    shared_config = GenerativeConfig

    @property
    def time_scale(self) -> float:  # type: ignore[override]  # the teacher's time embedding: the teacher's weights fit
        from robotrl.policies.flow import FlowPolicy

        return FlowPolicy.time_scale if self.config.teacher == "flow" else 1.0

    @property
    def teacher_kind(self) -> str:  # type: ignore[override]
        return self.config.teacher

    @property
    def teacher_name(self) -> str:  # type: ignore[override]
        return self.config.teacher

    def __init__(
        self, spec: Spec, config: ConsistencyConfig | None = None, stats: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        super().__init__(spec, config, stats)
        self.init_grid(self.config.train_steps)

    @classmethod
    def from_teacher(
        cls,
        teacher: GenerativePolicy,
        teacher_steps: int | None = None,
        teacher_solver: str | None = None,
        channels: tuple[int, ...] | None = None,
    ) -> ConsistencyPolicy:
        """A student with the teacher's spec, normalization, architecture and weights, distilled on the teacher's
        own sampler grid unless `teacher_steps` / `teacher_solver` say otherwise.

        `channels` other than the teacher's gives a narrower (faster) student: one call of the teacher's own
        network can be at most ~10x cheaper than ten. Its U-Net starts fresh (only the observation encoder is
        the teacher's), so it needs more distillation steps than a student that starts as the teacher."""
        kind = ode_kind(teacher)
        if teacher.student != cls.name or kind is None:
            raise TypeError(
                f"ConsistencyPolicy.from_teacher: expected a flow or diffusion teacher whose student is "
                f"{cls.name!r}, got {teacher.name!r} ({type(teacher).__name__}, student "
                f"{teacher.student!r}); student_for(teacher) picks the student"
            )
        tc = teacher.config
        shared = {f.name: getattr(tc, f.name) for f in dataclasses.fields(GenerativeConfig)}
        if channels is not None:
            if tc.backbone != "unet":
                raise ValueError(
                    f"ConsistencyPolicy.from_teacher: channels narrows a U-Net student; this teacher's backbone is "
                    f"{tc.backbone!r} (leave channels unset)"
                )
            if len(channels) != len(tc.channels):
                raise ValueError(
                    f"ConsistencyPolicy.from_teacher: channels: expected {len(tc.channels)} U-Net levels "
                    f"as the teacher's {tc.channels} (the padded chunk length depends on them), got "
                    f"{tuple(channels)}"
                )
            shared["channels"] = tuple(channels)
        config = ConsistencyConfig(
            **shared,
            teacher=kind,
            teacher_steps=teacher_steps if teacher_steps is not None else tc.steps,
            teacher_solver=teacher_solver or str(getattr(tc, "solver", "euler")),
            train_steps=getattr(tc, "train_steps", ConsistencyConfig.train_steps),
        )
        student = cls(teacher.spec, config, teacher.stats or None)
        if config.channels == tc.channels:
            student.load_state_dict(teacher.state_dict())
        else:
            student.encoder.load_state_dict(teacher.encoder.state_dict())
            for head in ("prior", "residual"):
                if getattr(teacher, head) is not None:
                    getattr(student, head).load_state_dict(getattr(teacher, head).state_dict())
        for module in (student.prior, student.residual):  # the teacher's, kept as they are: distillation fits the net
            if module is not None:
                module.requires_grad_(False)
        return student.to(next(teacher.parameters()).device)


@dataclass
class VLAConsistencyConfig(VLAConfig):
    teacher_steps: int = 10
    """N: points of the VLA teacher's flow grid the student is distilled on (its own sampler steps)"""
    teacher_solver: str = "euler"
    """'euler' or 'heun' steps along the grid"""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_grid(self)


@register
class VLAConsistencyPolicy(ConsistencyHead, VLAPolicy):  # type: ignore[misc]  # ConsistencyHead.loss replaces the teacher's
    """The VLA's one-step student: the teacher's prefix and action expert (and weights), one expert call per
    chunk instead of `steps`, the prefix computed once either way. Its `steps` / `solver` fields are the
    teacher's and unused."""

    name = "vla_consistency"
    config_cls = VLAConsistencyConfig
    learns_from_data = False
    student = None
    config: VLAConsistencyConfig
    teacher_kind = "flow"
    teacher_name = "vla"
    shared_config = VLAConfig

    def __init__(
        self,
        spec: Spec,
        config: VLAConsistencyConfig | None = None,
        stats: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(spec, config, stats)
        self.init_grid()

    @classmethod
    def from_teacher(
        cls,
        teacher: VLAPolicy,
        teacher_steps: int | None = None,
        teacher_solver: str | None = None,
        channels: tuple[int, ...] | None = None,
    ) -> VLAConsistencyPolicy:
        """The student of a VLA teacher: its spec, normalization, config and weights; untrained, it is the
        teacher's one-step Euler sampler. It keeps the teacher's transformer (`channels` narrows U-Nets only)."""
        if not isinstance(teacher, VLAPolicy) or teacher.student != cls.name:
            raise TypeError(f"VLAConsistencyPolicy.from_teacher: expected a 'vla' teacher, got {teacher.name!r}")
        if channels is not None:
            raise ValueError(
                f"student_for: channels={tuple(channels)} narrows a U-Net student; a VLA's student keeps "
                "its teacher's transformer (leave channels unset)"
            )
        tc = teacher.config
        shared = {f.name: getattr(tc, f.name) for f in dataclasses.fields(VLAConfig)}
        config = VLAConsistencyConfig(
            **shared,
            teacher_steps=teacher_steps if teacher_steps is not None else tc.steps,
            teacher_solver=teacher_solver or tc.solver,
        )
        student = cls(teacher.spec, config, teacher.stats or None)
        student.load_state_dict(teacher.state_dict())
        return student.to(next(teacher.parameters()).device)


def student_for(
    teacher: Any,
    teacher_steps: int | None = None,
    teacher_solver: str | None = None,
    channels: tuple[int, ...] | None = None,
) -> ConsistencyPolicy | VLAConsistencyPolicy:
    """The one-step student of a teacher, of the registered class its own class names (`Policy.student`);
    `channels`: a narrower U-Net (U-Net teachers only)."""
    if teacher.student is None:
        raise TypeError(
            f"student_for: expected a teacher, one of {teachers()}, got {teacher.name!r} "
            f"({type(teacher).__name__}, which names no student)"
        )
    student_cls = register_all()[teacher.student]
    if not issubclass(student_cls, (ConsistencyPolicy, VLAConsistencyPolicy)):
        raise TypeError(
            f"student_for: {teacher.name!r} names the student {teacher.student!r}, which is not a consistency "
            f"policy ({student_cls.__name__})"
        )
    return student_cls.from_teacher(teacher, teacher_steps, teacher_solver, channels)
