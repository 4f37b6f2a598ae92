"""Minimal GPT-2 in PyTorch with MatrixFSDP's conventions, plus a small safetensors reader/writer.

This is the PyTorch side of the model comparison tests. It is written from
the GPT-2 description, not copied from any implementation. Conventions (identical to
models/gpt_spec.h):

* Parameters live in a plain dict ``name -> torch.Tensor`` (fp32), in the order of
  ``param_specs(cfg)``: ``wte.weight`` [Vp, C], ``wpe.weight`` [T, C], per block ``h.{i}.ln_1.*``,
  ``h.{i}.attn.c_attn.weight`` [3C, C], ``h.{i}.attn.c_proj.weight`` [C, C], ``h.{i}.ln_2.*``,
  ``h.{i}.mlp.c_fc.weight`` [4C, C], ``h.{i}.mlp.c_proj.weight`` [C, 4C] (+ biases),
  ``ln_f.*``, and ``lm_head.weight`` [Vp, C] only when untied. Vp = vocab_size rounded up to a
  multiple of 64.
* Matrices are [fan_out, fan_in]: y = x @ W^T + b (torch.nn.Linear convention).
* q, k, v are the three consecutive C-wide slices of the 3C c_attn outputs; heads are split as
  ``view(B, T, H, C // H)``. Causal softmax attention scaled by 1/sqrt(C // H).
* LayerNorm eps 1e-5; GELU with the tanh approximation.
* logits = ln_f(x) @ head^T over all Vp columns; cross-entropy only over the first vocab_size
  columns (padded columns never receive probability), mean over all B*T targets.

The Hugging Face layout (``to_hf_layout`` / ``from_hf_layout``) stores c_attn, c_proj and c_fc
weights as Conv1D [in, out] (the transpose) and cuts wte / lm_head to [vocab_size, C].
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------------------------

# safetensors dtype name -> (numpy dtype, bytes per element). BF16 is decoded by hand.
_ST_DTYPES = {
    "F64": (np.dtype("<f8"), 8),
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),
    "I64": (np.dtype("<i8"), 8),
    "I32": (np.dtype("<i4"), 4),
    "I16": (np.dtype("<i2"), 2),
    "I8": (np.dtype("i1"), 1),
    "U8": (np.dtype("u1"), 1),
}
_NP_TO_ST = {np.dtype("float32"): "F32", np.dtype("int32"): "I32", np.dtype("float64"): "F64",
             np.dtype("int64"): "I64"}
_MAX_HEADER_BYTES = 100 * 1024 * 1024


def save_safetensors(path: str, tensors: Mapping[str, object],
                     metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes ``tensors`` (name -> torch.Tensor or numpy array; f32/i32/f64/i64) to ``path``.

    Layout: u64 little-endian header length N, N bytes of JSON header (padded with spaces so that
    8 + N is a multiple of 8), then the raw little-endian data of each tensor in insertion order.
    ``metadata`` values must be strings. The output is a deterministic function of the inputs.
    Raises ValueError on an unsupported dtype or a non-string metadata value.
    """
    header: Dict[str, object] = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ValueError(f"[save_safetensors] metadata {k!r}: keys and values must be str, "
                                 f"got {type(v).__name__}")
        header["__metadata__"] = dict(metadata)
    blobs: List[bytes] = []
    offset = 0
    for name, t in tensors.items():
        if name == "__metadata__":
            raise ValueError("[save_safetensors] '__metadata__' is not a valid tensor name")
        arr = t.detach().cpu().contiguous().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        if arr.dtype not in _NP_TO_ST:
            raise ValueError(f"[save_safetensors] tensor {name!r}: unsupported dtype {arr.dtype}")
        raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _NP_TO_ST[arr.dtype], "shape": [int(d) for d in arr.shape],
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - (8 + len(hjson)) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Reads a safetensors file. Returns (name -> torch.Tensor, metadata dict).

    F32/F64/F16/I*/U8 load as their torch dtype; BF16 is widened to float32. Every header field
    is bounds-checked; raises ValueError naming the file and the offending tensor otherwise.
    """
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"[load_safetensors] {path}: file has {len(data)} bytes, need >= 8")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8 or n > _MAX_HEADER_BYTES:
        raise ValueError(f"[load_safetensors] {path}: header length {n} exceeds file size "
                         f"{len(data)}")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"[load_safetensors] {path}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"[load_safetensors] {path}: header is not a JSON object")
    body = memoryview(data)[8 + n:]
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError(f"[load_safetensors] {path}: __metadata__ must map strings to strings")
    out: Dict[str, torch.Tensor] = {}
    for name, info in header.items():
        where = f"[load_safetensors] {path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise ValueError(f"{where}: entry is not an object")
        dt = info.get("dtype")
        if dt not in _ST_DTYPES:
            raise ValueError(f"{where}: unsupported dtype {dt!r}")
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)):
            raise ValueError(f"{where}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) for o in offs)):
            raise ValueError(f"{where}: bad data_offsets {offs!r}")
        npdt, size = _ST_DTYPES[dt]
        numel = math.prod(shape)
        begin, end = offs
        if not (0 <= begin <= end <= len(body)) or end - begin != numel * size:
            raise ValueError(f"{where}: data_offsets {offs} do not hold {numel} x {dt} inside a "
                             f"{len(body)}-byte data block")
        arr = np.frombuffer(body[begin:end], dtype=npdt).reshape(shape)
        if dt == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="), copy=True))
    return out, dict(meta)


# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPTConfig:
    """GPT-2 hyperparameters (same fields and defaults as mfsdp::GPTConfig)."""
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    seq_len: int = 64
    vocab_size: int = 65
    tie_embeddings: bool = True

    @property
    def padded_vocab_size(self) -> int:
        """vocab_size rounded up to a multiple of 64."""
        return (self.vocab_size + 63) // 64 * 64

    def validate(self) -> None:
        """Raises ValueError naming the field when a value is out of range."""
        for f in ("n_layer", "n_head", "n_embd", "seq_len"):
            if getattr(self, f) < 1:
                raise ValueError(f"model.{f}: must be >= 1, got {getattr(self, f)}")
        if self.vocab_size < 2:
            raise ValueError(f"model.vocab_size: must be >= 2, got {self.vocab_size}")
        if self.n_embd % self.n_head:
            raise ValueError(f"model.n_embd: must be divisible by n_head "
                             f"({self.n_embd} % {self.n_head} != 0)")

    def to_metadata(self) -> Dict[str, str]:
        """The config as safetensors metadata strings (booleans as "true"/"false")."""
        return {"n_layer": str(self.n_layer), "n_head": str(self.n_head),
                "n_embd": str(self.n_embd), "seq_len": str(self.seq_len),
                "vocab_size": str(self.vocab_size),
                "tie_embeddings": "true" if self.tie_embeddings else "false"}

    @staticmethod
    def from_metadata(meta: Mapping[str, str], where: str = "") -> "GPTConfig":
        """Parses the keys written by to_metadata. Raises ValueError naming a missing/bad key."""
        vals = {}
        for k in ("n_layer", "n_head", "n_embd", "seq_len", "vocab_size"):
            if k not in meta:
                raise ValueError(f"{where}__metadata__ has no key {k!r}")
            try:
                vals[k] = int(meta[k])
            except ValueError:
                raise ValueError(f"{where}__metadata__.{k}: expected an integer, "
                                 f"got {meta[k]!r}") from None
        tie = str(meta.get("tie_embeddings", "true")).strip().lower()
        if tie not in ("true", "false", "1", "0"):
            raise ValueError(f"{where}__metadata__.tie_embeddings: expected true/false, got {tie!r}")
        cfg = GPTConfig(tie_embeddings=tie in ("true", "1"), **vals)
        cfg.validate()
        return cfg


def param_specs(cfg: GPTConfig) -> List[Tuple[str, Tuple[int, ...]]]:
    """(name, shape) of every parameter, in the order of gpt_inventory() in models/gpt_spec.cpp."""
    C, Vp, T = cfg.n_embd, cfg.padded_vocab_size, cfg.seq_len
    specs = [("wte.weight", (Vp, C)), ("wpe.weight", (T, C))]
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        specs += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                  (p + "attn.c_attn.weight", (3 * C, C)), (p + "attn.c_attn.bias", (3 * C,)),
                  (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
                  (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                  (p + "mlp.c_fc.weight", (4 * C, C)), (p + "mlp.c_fc.bias", (4 * C,)),
                  (p + "mlp.c_proj.weight", (C, 4 * C)), (p + "mlp.c_proj.bias", (C,))]
    specs += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    if not cfg.tie_embeddings:
        specs.append(("lm_head.weight", (Vp, C)))
    return specs


def init_params(cfg: GPTConfig, gen: torch.Generator) -> Dict[str, torch.Tensor]:
    """GPT-2 initialization drawn from ``gen`` in param_specs order (fp32, requires_grad).

    Weights (wte, wpe, matrices, lm_head) ~ N(0, 0.02); attn.c_proj / mlp.c_proj weights
    ~ N(0, 0.02 / sqrt(2 * n_layer)); biases 0; LayerNorm gains 1; padded wte/lm_head rows 0.
    """
    params = {}
    resid_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, shape in param_specs(cfg):
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            t = torch.ones(shape)
        elif name.endswith(".bias"):
            t = torch.zeros(shape)
        else:
            std = resid_std if name.endswith("c_proj.weight") else 0.02
            t = torch.randn(shape, generator=gen) * std
            if name in ("wte.weight", "lm_head.weight"):
                t[cfg.vocab_size:] = 0.0
        params[name] = t.float().requires_grad_(True)
    return params


def check_params(params: Mapping[str, torch.Tensor], cfg: GPTConfig, where: str = "") -> None:
    """Raises ValueError at the first missing, extra or mis-shaped parameter."""
    specs = param_specs(cfg)
    want = dict(specs)
    for name, shape in specs:
        if name not in params:
            raise ValueError(f"{where}missing parameter {name!r} (shape {list(shape)})")
        if tuple(params[name].shape) != shape:
            raise ValueError(f"{where}parameter {name!r} has shape {list(params[name].shape)}, "
                             f"expected {list(shape)}")
    for name in params:
        if name not in want:
            raise ValueError(f"{where}unexpected parameter {name!r}")


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def forward(params: Mapping[str, torch.Tensor], cfg: GPTConfig,
            tokens: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, Vp] (fp32) for int tokens [B, T] (T <= seq_len, ids < vocab_size)."""
    B, T = tokens.shape
    if T > cfg.seq_len:
        raise ValueError(f"[forward] sequence length {T} exceeds seq_len {cfg.seq_len}")
    C, H = cfg.n_embd, cfg.n_head
    D = C // H
    tok = tokens.long()
    x = params["wte.weight"][tok] + params["wpe.weight"][:T].unsqueeze(0)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        h = _layer_norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"])
        qkv = F.linear(h, params[p + "attn.c_attn.weight"], params[p + "attn.c_attn.bias"])
        q, k, v = qkv.split(C, dim=-1)
        q = q.reshape(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
        k = k.reshape(B, T, H, D).transpose(1, 2)
        v = v.reshape(B, T, H, D).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, params[p + "attn.c_proj.weight"], params[p + "attn.c_proj.bias"])
        h = _layer_norm(x, params[p + "ln_2.weight"], params[p + "ln_2.bias"])
        h = F.gelu(F.linear(h, params[p + "mlp.c_fc.weight"], params[p + "mlp.c_fc.bias"]),
                   approximate="tanh")
        x = x + F.linear(h, params[p + "mlp.c_proj.weight"], params[p + "mlp.c_proj.bias"])
    x = _layer_norm(x, params["ln_f.weight"], params["ln_f.bias"])
    head = params["wte.weight"] if cfg.tie_embeddings else params["lm_head.weight"]
    return x @ head.t()


def loss_from_logits(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Mean cross-entropy over all B*T targets using only the first vocab_size logit columns."""
    V = vocab_size
    return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1).long())


def adamw_param_groups(params: Mapping[str, torch.Tensor], weight_decay: float) -> List[dict]:
    """torch.optim param groups: weight decay on tensors with dim >= 2, none on the rest."""
    decay = [t for t in params.values() if t.dim() >= 2]
    no_decay = [t for t in params.values() if t.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


# --------------------------------------------------------------------------------------------
# Hugging Face layout
# --------------------------------------------------------------------------------------------

_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                    "mlp.c_proj.weight")
# Non-parameter buffers some HF GPT-2 files carry (the causal mask); ignored on load.
_HF_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def to_hf_layout(params: Mapping[str, torch.Tensor], cfg: GPTConfig) -> Dict[str, torch.Tensor]:
    """Our layout -> HF layout: Conv1D weights transposed to [in, out], wte/lm_head cut to
    [vocab_size, C]. Same names, same order, contiguous fp32 copies."""
    check_params(params, cfg, "[to_hf_layout] ")
    out = {}
    for name, _ in param_specs(cfg):
        t = params[name].detach()
        if name.endswith(_CONV1D_SUFFIXES):
            t = t.t()
        elif name in ("wte.weight", "lm_head.weight"):
            t = t[:cfg.vocab_size]
        out[name] = t.contiguous().clone().float()
    return out


def from_hf_layout(tensors: Mapping[str, torch.Tensor], cfg: GPTConfig,
                   where: str = "") -> Dict[str, torch.Tensor]:
    """HF layout -> our layout (inverse of to_hf_layout; wte/lm_head padded with zero rows).

    An optional "transformer." name prefix is stripped; causal-mask buffers are ignored; when the
    head is tied, an lm_head.weight equal to wte is ignored. Raises ValueError at the first name or
    shape that does not match ``cfg``.
    """
    src = {}
    for name, t in tensors.items():
        n = name[len("transformer."):] if name.startswith("transformer.") else name
        if n.endswith(_HF_IGNORED_SUFFIXES):
            continue
        src[n] = t
    if cfg.tie_embeddings and "lm_head.weight" in src and "wte.weight" in src:
        if torch.equal(src["lm_head.weight"].float(), src["wte.weight"].float()):
            del src["lm_head.weight"]
    want = dict(param_specs(cfg))
    for name in src:
        if name not in want:
            raise ValueError(f"{where}unexpected tensor {name!r} for config {cfg}")
    out = {}
    for name, shape in param_specs(cfg):
        if name not in src:
            raise ValueError(f"{where}missing tensor {name!r}")
        t = src[name].float()
        if name.endswith(_CONV1D_SUFFIXES):
            hf_shape = (shape[1], shape[0])
        elif name in ("wte.weight", "lm_head.weight"):
            hf_shape = (cfg.vocab_size, shape[1])
        else:
            hf_shape = shape
        if tuple(t.shape) != hf_shape:
            raise ValueError(f"{where}tensor {name!r} has shape {list(t.shape)}, expected "
                             f"{list(hf_shape)} (HF layout)")
        if name.endswith(_CONV1D_SUFFIXES):
            t = t.t()
        elif name in ("wte.weight", "lm_head.weight"):
            t = torch.cat([t, torch.zeros(shape[0] - cfg.vocab_size, shape[1])], dim=0)
        out[name] = t.contiguous().clone()
    return out


def save_hf(path: str, params: Mapping[str, torch.Tensor], cfg: GPTConfig,
            extra_metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes the model in the HF GPT-2 layout with the config in __metadata__."""
    meta = {"format": "pt", **cfg.to_metadata(), **(extra_metadata or {})}
    save_safetensors(path, to_hf_layout(params, cfg), meta)


def load_hf(path: str) -> Tuple[Dict[str, torch.Tensor], GPTConfig]:
    """Reads a file written by save_hf (or the C++ export). Returns (params in our layout, cfg)."""
    tensors, meta = load_safetensors(path)
    cfg = GPTConfig.from_metadata(meta, where=f"[load_hf] {path}: ")
    return from_hf_layout(tensors, cfg, where=f"[load_hf] {path}: "), cfg


# --------------------------------------------------------------------------------------------
# llm.c token shards
# --------------------------------------------------------------------------------------------

SHARD_MAGIC = 20240520
SHARD_VERSION = 1


def write_token_shard(path: str, tokens: np.ndarray) -> None:
    """Writes uint16 tokens as an llm.c shard (256 x int32 header: magic, version 1, ntok)."""
    toks = np.asarray(tokens)
    if toks.size and (toks.min() < 0 or toks.max() > 65535):
        raise ValueError(f"[write_token_shard] {path}: token ids must be in [0, 65535]")
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, toks.size
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.astype("<u2").tobytes())


def read_token_window(path: str, offset: int, count: int) -> np.ndarray:
    """Reads ``count`` uint16 tokens starting at token ``offset`` of an llm.c shard (int64 array).

    Validates magic, version and file size (1024 + 2*ntok); raises ValueError naming the file.
    """
    size = os.path.getsize(path)
    if size < 1024:
        raise ValueError(f"[read_token_window] {path}: {size} bytes, shorter than the 1024-byte "
                         f"header")
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        if header[0] != SHARD_MAGIC:
            raise ValueError(f"[read_token_window] {path}: magic {header[0]}, expected "
                             f"{SHARD_MAGIC} (not an llm.c token shard)")
        if header[1] != SHARD_VERSION:
            raise ValueError(f"[read_token_window] {path}: version {header[1]}, expected "
                             f"{SHARD_VERSION}")
        ntok = int(header[2])
        if ntok < 0 or size != 1024 + 2 * ntok:
            raise ValueError(f"[read_token_window] {path}: header says {ntok} tokens, file size "
                             f"{size} != {1024 + 2 * ntok}")
        if offset < 0 or count < 0 or offset + count > ntok:
            raise ValueError(f"[read_token_window] {path}: need tokens [{offset}, "
                             f"{offset + count}), shard has {ntok}")
        f.seek(1024 + 2 * offset)
        return np.frombuffer(f.read(2 * count), dtype="<u2").astype(np.int64)


def setup_determinism(threads: int = 1) -> None:
    """Single thread, deterministic algorithms, fp32 default dtype."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)


def write_fixture(path, tensors, meta):
    """Writes a fixture, reads it back and checks every tensor is bitwise what was meant."""
    save_safetensors(path, tensors, meta)
    back, _ = load_safetensors(path)
    for k, v in tensors.items():
        assert torch.equal(back[k], v), k
