"""Network blocks the policies share: an MLP, time embeddings, the 1D temporal U-Net over action chunks (or a
residual MLP over them), and the observation encoder (state MLP + ResNet-style image encoder with GroupNorm and
spatial softmax)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn


def mlp(
    sizes: Sequence[int], act: type[nn.Module] = nn.Mish, layer_norm: bool = False, final_act: bool = False
) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        last = i == len(sizes) - 2
        if not last or final_act:
            if layer_norm:
                layers.append(nn.LayerNorm(b))
            layers.append(act())
    return nn.Sequential(*layers)


def last_linear(net: nn.Sequential) -> nn.Linear:
    """The last layer of an `mlp` (its output layer), typed as the Linear it is."""
    layer = net[-1]
    if not isinstance(layer, nn.Linear):
        raise TypeError(f"expected an MLP ending in a Linear layer, got {type(layer).__name__}")
    return layer


class SinusoidalEmbedding(nn.Module):
    """Scalar (diffusion step, flow time) -> a vector of sines and cosines at geometric frequencies."""

    def __init__(self, dim: int, scale: float = 1.0) -> None:
        super().__init__()
        self.dim, self.scale = dim, scale

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freqs = torch.exp(
            -math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / max(half - 1, 1)
        )
        arg = (t.float().reshape(-1, 1) * self.scale) * freqs
        return torch.cat([arg.sin(), arg.cos()], dim=-1)


def time_embedding(time_dim: int, scale: float, hidden: int) -> nn.Sequential:
    """A scalar time (or interval) -> a learned `time_dim` vector: sinusoids, then a one-hidden-layer MLP."""
    return nn.Sequential(
        SinusoidalEmbedding(time_dim, scale), nn.Linear(time_dim, hidden), nn.Mish(), nn.Linear(hidden, time_dim)
    )


# ---------------------------------------------------------------------------------------------------
# 1D temporal U-Net (the diffusion-policy denoiser): conv residual blocks over the chunk's time axis,
# FiLM-conditioned on the observation features and the noise level
# ---------------------------------------------------------------------------------------------------
class Conv1dBlock(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int, groups: int = 8) -> None:
        super().__init__(nn.Conv1d(cin, cout, kernel, padding=kernel // 2), nn.GroupNorm(groups, cout), nn.Mish())


class FiLMResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, cond_dim: int, kernel: int = 5, groups: int = 8) -> None:
        super().__init__()
        self.block1, self.block2 = Conv1dBlock(cin, cout, kernel, groups), Conv1dBlock(cout, cout, kernel, groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * cout))
        self.skip = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, bias = self.film(cond).unsqueeze(-1).chunk(2, dim=1)
        return self.block2(self.block1(x) * (1 + scale) + bias) + self.skip(x)


class TemporalUnet(nn.Module):
    """Predicts a (B, H, A) tensor (noise, velocity or clean chunk) from a noisy chunk, a noise level / time
    embedding and an observation feature vector. Down/up-samples the chunk's time axis once per level."""

    def __init__(
        self,
        action_dim: int,
        cond_dim: int,
        channels: Sequence[int] = (64, 128, 256),
        time_dim: int = 64,
        kernel: int = 5,
        groups: int = 8,
        time_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.time = time_embedding(time_dim, time_scale, 4 * time_dim)
        cond = cond_dim + time_dim
        chans = [action_dim, *channels]
        self.down = nn.ModuleList()
        for i, (a, b) in enumerate(itertools.pairwise(chans)):
            last = i == len(channels) - 1
            self.down.append(
                nn.ModuleList(
                    [
                        FiLMResBlock(a, b, cond, kernel, groups),
                        FiLMResBlock(b, b, cond, kernel, groups),
                        nn.Conv1d(b, b, 3, stride=2, padding=1) if not last else nn.Identity(),
                    ]
                )
            )
        mid = channels[-1]
        self.mid = nn.ModuleList(
            [FiLMResBlock(mid, mid, cond, kernel, groups), FiLMResBlock(mid, mid, cond, kernel, groups)]
        )
        self.up = nn.ModuleList()
        for a, b in zip(reversed(channels[1:]), reversed(channels[:-1])):
            self.up.append(
                nn.ModuleList(
                    [
                        FiLMResBlock(2 * a, b, cond, kernel, groups),
                        FiLMResBlock(b, b, cond, kernel, groups),
                        nn.ConvTranspose1d(b, b, 4, stride=2, padding=1),
                    ]
                )
            )
        self.out = nn.Sequential(
            Conv1dBlock(channels[0], channels[0], kernel, groups), nn.Conv1d(channels[0], action_dim, 1)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        horizon = x.shape[1]
        c = torch.cat([cond, self.time(t.expand(x.shape[0]) if t.numel() == 1 else t)], dim=-1)
        h = x.transpose(1, 2)
        skips = []
        for res1, res2, down in cast("Iterable[tuple[nn.Module, nn.Module, nn.Module]]", self.down):
            h = res2(res1(h, c), c)
            skips.append(h)
            h = down(h)
        for res in self.mid:
            h = res(h, c)
        for res1, res2, up in cast("Iterable[tuple[nn.Module, nn.Module, nn.Module]]", self.up):
            skip = skips.pop()
            h = h[..., : skip.shape[-1]]
            h = res2(res1(torch.cat([h, skip], dim=1), c), c)
            h = up(h)
        return self.out(h[..., :horizon]).transpose(1, 2)


class ChunkMLP(nn.Module):
    """Predicts a (B, H, A) tensor like `TemporalUnet`, with a residual MLP over the flattened chunk, the observation
    features and the time embedding (pre-LayerNorm blocks, as IDQL's LN-ResNet): for short chunks of small actions
    from state, where the chunk's time axis leaves little to convolve, it costs a fraction of the U-Net's work."""

    def __init__(
        self,
        action_dim: int,
        horizon: int,
        cond_dim: int,
        width: int = 256,
        depth: int = 3,
        time_dim: int = 64,
        time_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.time = time_embedding(time_dim, time_scale, 2 * time_dim)
        self.inp = nn.Linear(horizon * action_dim + cond_dim + time_dim, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.Mish(), nn.Linear(2 * width, width))
            for _ in range(depth)
        )
        self.out = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, horizon * action_dim))

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        b, h, a = x.shape
        z = self.inp(torch.cat([x.reshape(b, h * a), cond, self.time(t.expand(b) if t.numel() == 1 else t)], dim=-1))
        for block in self.blocks:
            z = z + block(z)
        return self.out(z).reshape(b, h, a)


def padded_horizon(horizon: int, levels: int) -> int:
    """The chunk length the U-Net runs on: a multiple of 2**(levels-1) so down/up-sampling round-trips."""
    m = 2 ** max(levels - 1, 0)
    return -(-horizon // m) * m


# ---------------------------------------------------------------------------------------------------
# observation encoder
# ---------------------------------------------------------------------------------------------------
class SpatialSoftmax(nn.Module):
    """Feature map (B, C, H, W) -> expected (x, y) image coordinates of each of `keypoints` attention maps:
    where things are, which is what a manipulation policy needs from a camera."""

    def __init__(self, channels: int, keypoints: int = 32) -> None:
        super().__init__()
        self.proj = nn.Conv2d(channels, keypoints, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        att = F.softmax(self.proj(x).flatten(2), dim=-1)  # (B, K, H*W)
        ys, xs = torch.meshgrid(
            torch.linspace(-1, 1, h, device=x.device), torch.linspace(-1, 1, w, device=x.device), indexing="ij"
        )
        grid = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)  # (H*W, 2)
        return (att @ grid).reshape(b, -1)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = nn.GroupNorm(groups, cout)
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(groups, cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.n2(self.conv2(F.relu(self.n1(self.conv1(x))))) + self.skip(x))


class ImageEncoder(nn.Module):
    """A small ResNet with GroupNorm (BatchNorm breaks with EMA weights and small batches) and a spatial-softmax
    head, trained from scratch; random crops during training (diffusion policy's augmentation), a centre crop
    at inference."""

    def __init__(
        self,
        image_size: int,
        out_dim: int = 64,
        widths: Sequence[int] = (32, 64, 128),
        crop: float = 0.9,
        keypoints: int = 32,
    ) -> None:
        super().__init__()
        self.crop = max(8, round(image_size * crop))
        layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 5, 2, 2, bias=False), nn.GroupNorm(8, widths[0]), nn.ReLU()]
        cin = widths[0]
        for w in widths:
            layers += [BasicBlock(cin, w, 2 if w != widths[0] else 1), BasicBlock(w, w, 1)]
            cin = w
        self.trunk = nn.Sequential(*layers)
        self.pool = SpatialSoftmax(cin, keypoints)
        self.head = nn.Sequential(nn.Linear(2 * keypoints, out_dim), nn.LayerNorm(out_dim), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images (N, H, W, 3) in [0, 1] -> features (N, out_dim)."""
        x = x.permute(0, 3, 1, 2)
        h, w = x.shape[-2:]
        c = self.crop
        if self.training:
            top = torch.randint(0, h - c + 1, (1,)).item()
            left = torch.randint(0, w - c + 1, (1,)).item()
        else:
            top, left = (h - c) // 2, (w - c) // 2
        x = x[..., top : top + c, left : left + c]
        return self.head(self.pool(self.trunk(x * 2.0 - 1.0)))


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """DrQ's augmentation for RL from pixels: every image (N, H, W, C) moved by its own random offset of up to
    `pad` pixels, edges replicated. Per sample, unlike `ImageEncoder`'s one crop per batch: an actor-critic's
    TD targets average over many shifts of the same frame, which is what regularizes the critic."""
    if pad <= 0:
        return images
    n, h, w, _ = images.shape
    padded = F.pad(images.permute(0, 3, 1, 2), (pad, pad, pad, pad), mode="replicate").permute(0, 2, 3, 1)
    dy, dx = torch.randint(0, 2 * pad + 1, (2, n, 1), device=images.device)
    rows = dy + torch.arange(h, device=images.device)  # (N, H)
    cols = dx + torch.arange(w, device=images.device)  # (N, W)
    return padded[torch.arange(n, device=images.device)[:, None, None], rows[:, :, None], cols[:, None, :]]


class ObsEncoder(nn.Module):
    """Normalized observations (B, To, ...) per key -> one conditioning vector (B, cond_dim): vectors are
    concatenated as they are, each camera has its own `ImageEncoder`, all To frames are flattened together."""

    def __init__(
        self, vector_dims: Mapping[str, int], image_sizes: Mapping[str, int], obs_horizon: int, image_dim: int = 64
    ) -> None:
        super().__init__()
        self.vector_keys = list(vector_dims)
        self.images = nn.ModuleDict({k: ImageEncoder(s, image_dim) for k, s in image_sizes.items()})
        self.out_dim = obs_horizon * (sum(vector_dims.values()) + image_dim * len(image_sizes))

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        parts = []
        for k in self.vector_keys:
            parts.append(obs[k].flatten(1))
        for k, enc in self.images.items():
            x = obs[k]
            b = x.shape[0]
            parts.append(enc(x.flatten(0, 1)).reshape(b, -1))
        return torch.cat(parts, dim=-1)
