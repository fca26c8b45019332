"""A vision-language-action policy with pi0's layout at CPU size: a small "VLM" over image, language and state
tokens, and a flow-matching action expert that attends to it.

    prefix  image patch tokens (per camera and frame: a conv trunk's grid, pooled to patch_grid x patch_grid)
            + one language token (the frozen sentence encoder's embedding, projected)
            + one proprioception token (the state history)
            -> `depth` transformer layers, bidirectional within the prefix
    suffix  action tokens (noisy chunk + flow-time embedding, one per step of the chunk)
            -> `depth` layers of the action expert (its own weights), each attending to the prefix layer's
               keys/values and to the other action tokens -> the velocity of the chunk

This is pi0's blockwise-causal attention (prefix attends to itself; actions attend to prefix + each other).
Because the prefix never attends to the actions, its keys and values are computed once per observation and
reused by every integration step. Training and sampling are `FlowPolicy`'s (rectified flow, Euler or Heun):
`VLAPolicy` subclasses it and supplies the two networks it calls, `encoder(obs) -> cond` (here: the prefix's
per-layer keys/values) and `net(x_t, t, cond) -> velocity` (here: the action expert).

The instruction is the string observation `instruction_key` (one string per env or window; a training batch
from `SequenceSampler` carries each window's episode instruction). `normalize_obs` turns it into the frozen
sentence encoder's embedding (cached per string), so the networks only ever see numbers, and an exported graph
takes the embedding as an input (`text_inputs`) that the runtime computes with the same encoder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from robotrl.core.spec import STRING, Spec, SpecMismatchError
from robotrl.policies.base import Policy, PolicyConfig, register
from robotrl.policies.flow import FlowPolicy
from robotrl.policies.language import DEFAULT_LANGUAGE_MODEL, check_instructions, language_encoder, language_model_info
from robotrl.policies.nets import BasicBlock, SinusoidalEmbedding, mlp


@dataclass
class VLAConfig(PolicyConfig):
    width: int = 128
    """token width of the prefix transformer and of the action expert"""
    depth: int = 4
    """transformer layers (the expert has as many: layer l of the expert reads layer l of the prefix)"""
    heads: int = 4
    mlp_ratio: int = 4
    patch_grid: int = 4
    """image tokens per camera and frame: patch_grid ** 2"""
    image_widths: tuple[int, ...] = (32, 64, 128)
    """conv trunk channels (each stage after the first halves the resolution)"""
    crop: float = 0.9
    """random-crop fraction in training (centre crop at inference)"""
    language_model: str = DEFAULT_LANGUAGE_MODEL
    """the frozen sentence encoder (not saved with the policy; the same one must be installed to load it)"""
    language_dim: int = 384
    """its embedding size (checked against the installed encoder)"""
    instruction_key: str = "instruction"
    """the spec's string observation that holds the instruction"""
    steps: int = 10
    """integration steps at inference (changeable after training: `policy.config.steps = k`)"""
    solver: str = "euler"
    """'euler' or 'heun'"""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.image_widths = tuple(self.image_widths)
        for name in ("width", "depth", "heads", "mlp_ratio", "patch_grid", "steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"VLAConfig.{name}: expected an integer >= 1, got {value!r}")
        if self.width % self.heads:
            raise ValueError(f"VLAConfig.width: expected a multiple of heads={self.heads}, got {self.width}")
        if self.solver not in ("euler", "heun"):
            raise ValueError(f"VLAConfig.solver: expected 'euler' or 'heun', got {self.solver!r}")
        if not 0.0 < self.crop <= 1.0:
            raise ValueError(f"VLAConfig.crop: expected a fraction in (0, 1], got {self.crop}")
        info = language_model_info(self.language_model, "VLAConfig.language_model")
        if self.language_dim != info.dim:
            raise ValueError(
                f"VLAConfig.language_dim: {self.language_model} gives {info.dim}-dim embeddings, the config "
                f"says {self.language_dim} (a checkpoint made with another language model?)"
            )


# ---------------------------------------------------------------------------------------------------
# networks
# ---------------------------------------------------------------------------------------------------
class PatchEncoder(nn.Module):
    """Images (N, H, W, 3) in [0, 1] -> patch tokens (N, grid*grid, width): a small GroupNorm ResNet trunk,
    average-pooled to a grid. Random crop in training, centre crop at inference (as `nets.ImageEncoder`)."""

    def __init__(self, image_size: int, width: int, widths: Sequence[int], grid: int, crop: float) -> None:
        super().__init__()
        self.crop, self.grid = max(8, round(image_size * crop)), grid
        layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 5, 2, 2, bias=False), nn.GroupNorm(8, widths[0]), nn.ReLU()]
        cin = widths[0]
        for w in widths[1:]:
            layers.append(BasicBlock(cin, w, 2))
            cin = w
        self.trunk = nn.Sequential(*layers)
        self.proj = nn.Linear(cin, width)
        with torch.no_grad():
            size = self.trunk(torch.zeros(1, 3, self.crop, self.crop)).shape[-1]
        self.register_buffer("pool", adaptive_pool_matrix(size, grid), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 3, 1, 2)
        h, w = x.shape[-2:]
        c = self.crop
        if self.training:
            top, left = torch.randint(0, h - c + 1, (1,)).item(), torch.randint(0, w - c + 1, (1,)).item()
        else:
            top, left = (h - c) // 2, (w - c) // 2
        feat = self.trunk(x[..., top : top + c, left : left + c] * 2.0 - 1.0)
        feat = torch.einsum("ih,nchw,jw->nijc", self.pool, feat, self.pool)  # adaptive average pooling to (g, g)
        return self.proj(feat.flatten(1, 2))


def adaptive_pool_matrix(size: int, grid: int) -> torch.Tensor:
    """(grid, size) weights of adaptive average pooling along one axis (torch's bins: floor(i*size/grid) to
    ceil((i+1)*size/grid)). As a matrix product it exports to ONNX with a dynamic batch, which
    `adaptive_avg_pool2d` does not."""
    m = torch.zeros(grid, size)
    for i in range(grid):
        lo, hi = (i * size) // grid, -(-((i + 1) * size) // grid)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m


class Attention(nn.Module):
    """Multi-head attention of this block's queries over this block's keys/values, optionally after `context`
    keys/values (another block's, which are attended to but not updated: the blockwise-causal mask)."""

    def __init__(self, width: int, heads: int, queries: bool = True) -> None:
        super().__init__()
        self.heads = heads
        self.kv = nn.Linear(width, 2 * width)
        self.q = nn.Linear(width, width) if queries else None
        self.out = nn.Linear(width, width) if queries else None

    def split(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, W) -> (B, heads, T, W / heads)
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def keys_values(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, W) -> (2, B, heads, T, W / heads)."""
        k, v = self.kv(x).chunk(2, dim=-1)
        return torch.stack([self.split(k), self.split(v)])

    def forward(self, x: torch.Tensor, kv: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        assert self.q is not None and self.out is not None
        if context is not None:
            kv = torch.cat([context, kv], dim=3)
        y = F.scaled_dot_product_attention(self.split(self.q(x)), kv[0], kv[1])
        return self.out(y.transpose(1, 2).flatten(2))


class Block(nn.Module):
    """A pre-LayerNorm transformer layer whose attention can also read a context's keys/values. With
    `full=False` it only produces keys/values (the prefix's last layer: nothing reads its output tokens)."""

    def __init__(self, width: int, heads: int, mlp_ratio: int, full: bool = True) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads, queries=full)
        self.full = full
        if full:
            self.norm2 = nn.LayerNorm(width)
            self.mlp = nn.Sequential(
                nn.Linear(width, mlp_ratio * width), nn.GELU(approximate="tanh"), nn.Linear(mlp_ratio * width, width)
            )

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (the layer's output tokens (x itself when not `full`), its keys/values (2, B, heads, T, hd))."""
        h = self.norm1(x)
        kv = self.attn.keys_values(h)
        if not self.full:
            return x, kv
        x = x + self.attn(h, kv, context)
        return x + self.mlp(self.norm2(x)), kv


class VLAPrefix(nn.Module):
    """The "VLM": normalized observations (+ instruction strings) -> the prefix's keys/values of every layer,
    stacked as one tensor (B, depth, 2, heads, T_prefix, head_dim), which the action expert attends to."""

    def __init__(self, spec: Spec, config: VLAConfig, image_keys: Sequence[str], vector_keys: Sequence[str]) -> None:
        super().__init__()
        cfg = self.config = config
        w, to = cfg.width, cfg.obs_horizon
        self.image_keys, self.vector_keys = list(image_keys), list(vector_keys)
        self.images = nn.ModuleDict(
            {
                k: PatchEncoder(spec.observations[k].shape[0], w, cfg.image_widths, cfg.patch_grid, cfg.crop)
                for k in self.image_keys
            }
        )
        # where each patch token sits: (frame, patch) per camera
        self.image_pos = nn.ParameterDict(
            {k: nn.Parameter(0.02 * torch.randn(to * cfg.patch_grid**2, w)) for k in self.image_keys}
        )
        self.language = nn.Linear(cfg.language_dim, w)
        state_dim = to * sum(spec.observations[k].size for k in self.vector_keys)
        self.state = mlp([state_dim, w, w]) if state_dim else None
        self.type_emb = nn.Parameter(0.02 * torch.randn(2, w))  # language, state
        self.blocks = nn.ModuleList(
            [Block(w, cfg.heads, cfg.mlp_ratio, full=i < cfg.depth - 1) for i in range(cfg.depth)]
        )

    def tokens(self, obs: Mapping[str, Any]) -> torch.Tensor:
        parts = []
        for k, enc in self.images.items():
            x = obs[k]  # (B, To, H, W, 3)
            b, to = x.shape[:2]
            patches = enc(x.flatten(0, 1)).reshape(b, to * self.config.patch_grid**2, -1)
            parts.append(patches + self.image_pos[k])
        emb = obs[self.config.instruction_key]  # (B, language_dim): see VLAPolicy.normalize_obs
        parts.append((self.language(emb) + self.type_emb[0])[:, None])
        if self.state is not None:
            state = torch.cat([obs[k].flatten(2) for k in self.vector_keys], dim=-1)
            parts.append((self.state(state.flatten(1)) + self.type_emb[1])[:, None])
        batch = {int(p.shape[0]) for p in parts}
        if len(batch) != 1:
            raise SpecMismatchError(
                f"vla: observations and instructions disagree on the batch size: got "
                f"{emb.shape[0]} instruction(s) for {parts[0].shape[0]} observation window(s)"
            )
        return torch.cat(parts, dim=1)

    def forward(self, obs: Mapping[str, Any]) -> torch.Tensor:
        x = self.tokens(obs)
        cache = []
        for block in self.blocks:
            x, kv = block(x)
            cache.append(kv)
        return torch.stack(cache).permute(2, 0, 1, 3, 4, 5)  # (depth, 2, B, ...) -> (B, depth, 2, heads, T, hd)


class ActionExpert(nn.Module):
    """(noisy chunk x_t (B, H, A), flow time t (B,), prefix keys/values) -> velocity (B, H, A). Each action token
    is pi0's MLP of (action embedding, time embedding) plus a position embedding; layer l attends to the prefix's
    layer-l keys/values and to all action tokens."""

    def __init__(self, action_dim: int, horizon: int, config: VLAConfig, time_scale: float) -> None:
        super().__init__()
        w = config.width
        self.action_in = nn.Linear(action_dim, w)
        self.time = SinusoidalEmbedding(w, time_scale)
        self.action_time = nn.Sequential(nn.Linear(2 * w, w), nn.SiLU(), nn.Linear(w, w))
        self.pos = nn.Parameter(0.02 * torch.randn(horizon, w))
        self.blocks = nn.ModuleList([Block(w, config.heads, config.mlp_ratio) for _ in range(config.depth)])
        self.norm = nn.LayerNorm(w)
        self.out = nn.Linear(w, action_dim)
        nn.init.zeros_(self.out.weight)  # starts at velocity 0: loss = E|x1 - x0|^2, no early blow-up
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        t = t.expand(x.shape[0]) if t.numel() == 1 else t
        a = self.action_in(x)
        time = self.time(t)[:, None].expand_as(a)
        h = self.action_time(torch.cat([a, time], dim=-1)) + self.pos[: x.shape[1]]
        context = prefix.permute(1, 2, 0, 3, 4, 5)  # (depth, 2, B, heads, T, hd)
        for block, ctx in zip(self.blocks, context):
            h, _ = block(h, ctx)
        return self.out(self.norm(h))


# ---------------------------------------------------------------------------------------------------
# the policy
# ---------------------------------------------------------------------------------------------------
@register
class VLAPolicy(FlowPolicy):
    """pi0 at CPU size: a rectified-flow `FlowPolicy` whose observation encoder is the VLM prefix (images,
    instruction, state) and whose velocity network is the action expert. Loss, noise, and Euler/Heun
    integration are `FlowPolicy`'s."""

    name = "vla"
    config_cls = VLAConfig
    student: ClassVar[str | None] = "vla_consistency"
    config: VLAConfig
    encoder: VLAPrefix
    net: ActionExpert

    def __init__(
        self, spec: Spec, config: VLAConfig | None = None, stats: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        # Policy's setup (keys, normalizer), not GenerativePolicy's U-Net: the two networks are built here
        Policy.__init__(self, spec, config, stats)
        cfg = self.config
        key = cfg.instruction_key
        if key not in spec.observations or spec.observations[key].dtype != STRING:
            strings = [k for k, v in spec.observations.items() if v.dtype == STRING]
            raise SpecMismatchError(
                f"vla: expected the string observation {key!r} (the instruction) in the spec of task "
                f"{spec.task!r}; its string observations are {strings} (set VLAConfig.instruction_key, "
                f"or use a task with instructions)"
            )
        if not self.image_keys and not self.vector_keys:
            raise SpecMismatchError(f"vla: no numeric observations to condition on in {list(self.obs_keys)}")
        self.horizon = cfg.action_horizon  # a transformer needs no padding of the chunk
        self.encoder = VLAPrefix(spec, cfg, self.image_keys, self.vector_keys)
        self.net = ActionExpert(self.action_dim, self.horizon, cfg, self.time_scale)
        self.prior = self.residual = None  # VLAConfig has neither a noise prior nor a chunk residual

    @property
    def language(self) -> Any:
        """The frozen sentence encoder (shared, not saved; its embeddings are cached per instruction)."""
        return language_encoder(self.config.language_model)

    @property
    def text_inputs(self) -> dict[str, dict[str, Any]]:
        cfg = self.config
        return {cfg.instruction_key: {"encoder": cfg.language_model, "dim": cfg.language_dim}}

    def normalize_obs(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """Numeric keys normalized as every policy's; the instruction (B strings, one string for all, or
        precomputed embeddings (B, language_dim)) -> its frozen embedding (B, language_dim)."""
        key = self.config.instruction_key
        if key not in obs:
            raise SpecMismatchError(
                f"{self.name}: observation {key!r} missing: expected one instruction string per "
                f"env/window (B,) (a SequenceSampler batch carries it as batch['obs'][{key!r}])"
            )
        for k in self.obs_keys:
            want = (self.config.obs_horizon, *self.spec.observations[k].shape)
            if k not in obs or tuple(np.shape(obs[k]))[1:] != want:
                got = tuple(np.shape(obs[k])) if k in obs else "missing"
                raise SpecMismatchError(
                    f"{self.name}: observation {k!r}: expected shape (B, {', '.join(map(str, want))}) "
                    f"(obs_horizon={self.config.obs_horizon}), got {got}"
                )
        out: dict[str, Any] = super().normalize_obs(obs)
        batch = len(next(iter(out.values())))
        out[key] = self.embed(obs[key], batch).to(self.encoder.language.weight.device)
        return out

    def embed(self, text: Any, batch: int) -> torch.Tensor:
        """The instruction's embedding (B, language_dim): strings through the frozen encoder, numbers as given."""
        cfg = self.config
        checked = check_instructions(text, batch, cfg.language_dim, cfg.instruction_key, self.name)
        return self.language(checked) if isinstance(checked, list) else torch.as_tensor(checked, dtype=torch.float32)
