"""Quantized copies of a Llama-shaped checkpoint in the compressed-tensors formats vLLM's CPU
backend has kernels for (issue 60), made by round-to-nearest from its safetensors, no
calibration data and no llm-compressor:

- `int8`: W8A8, int8 weights per output channel, activations quantized per token at run time
  (vLLM's `CPUInt8ScaledMMLinearKernel`, oneDNN);
- `int4`: W4A16, int4 weights in groups of 32 along the input (`pack-quantized`, symmetric,
  stored offset by 8), computed in bfloat16 (vLLM's `CPUWNA16LinearKernel`).

The decoder layers' linear layers are quantized; the embedding and the tied `lm_head` stay as
they were.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

FORMATS = ("int8", "int4")
INT4_GROUP = 32
_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8)  # int4's scale search per group: least squared error


def quantized_checkpoint(source: Path, target: Path, form: str) -> Path:
    """`target`, a copy of the checkpoint `source` with its linear layers in `form`."""
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and item.name not in ("model.safetensors", "config.json"):
            shutil.copy(item, target / item.name)
    tensors: dict[str, torch.Tensor] = {}
    for name, weight in load_file(source / "model.safetensors").items():
        if is_quantized_linear(name):
            tensors |= _quantized(name.removesuffix(".weight"), weight, form)
        else:
            tensors[name] = weight
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization_config(form)
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


def is_quantized_linear(name: str) -> bool:
    return name.endswith(".weight") and any(f".{p}." in name for p in _LINEAR)


def _quantized(base: str, weight: torch.Tensor, form: str) -> dict[str, torch.Tensor]:
    if form == "int8":
        values, scale = int8_per_channel(weight)
        return {f"{base}.weight": values, f"{base}.weight_scale": scale}
    values, scale = int4_per_group(weight)
    return {
        f"{base}.weight_packed": packed_int4(values),
        f"{base}.weight_scale": scale,
        f"{base}.weight_shape": torch.tensor(list(weight.shape), dtype=torch.int64),
    }


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values and each output row's float32 scale (shape [rows, 1])."""
    wide = weight.float()
    scale = wide.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127
    return torch.clamp(torch.round(wide / scale), -128, 127).to(torch.int8), scale


def int4_per_group(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Values in [-8, 7] (int32, the weight's shape) and each group's scale in the weight's
    dtype (shape [rows, columns / INT4_GROUP])."""
    rows, columns = weight.shape
    groups = weight.float().reshape(rows, columns // INT4_GROUP, INT4_GROUP)
    absmax = groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8)
    best_scale = absmax / 7.5
    best_error = torch.full_like(absmax, float("inf"))
    for ratio in _CLIP_RATIOS:
        scale = (absmax * ratio / 7.5).to(weight.dtype).float()
        error = ((torch.clamp(torch.round(groups / scale), -8, 7) * scale - groups) ** 2).sum(
            dim=-1, keepdim=True
        )
        better = error < best_error
        best_scale = torch.where(better, scale, best_scale)
        best_error = torch.where(better, error, best_error)
    values = torch.clamp(torch.round(groups / best_scale), -8, 7).to(torch.int32)
    return values.reshape(rows, columns), best_scale.squeeze(-1).to(weight.dtype)


def packed_int4(values: torch.Tensor) -> torch.Tensor:
    """Eight values a 32-bit word along each row, the first in the lowest bits, each stored
    plus 8 (compressed-tensors' pack-quantized layout; vLLM's uint4b8)."""
    unsigned = (values + 8) & 0xF
    packed = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int32)
    for i in range(8):
        packed |= unsigned[:, i::8] << (4 * i)
    return packed


def quantization_config(form: str) -> dict[str, Any]:
    """The checkpoint's `quantization_config` (config.json), as compressed-tensors writes it."""
    if form == "int8":
        weights = {"num_bits": 8, "strategy": "channel", "group_size": None}
        activations: dict[str, Any] | None = {
            "num_bits": 8,
            "type": "int",
            "symmetric": True,
            "strategy": "token",
            "dynamic": True,
        }
        layout = "int-quantized"
    else:
        weights = {"num_bits": 4, "strategy": "group", "group_size": INT4_GROUP}
        activations = None
        layout = "pack-quantized"
    group = {
        "targets": ["Linear"],
        "weights": {**weights, "type": "int", "symmetric": True, "dynamic": False},
        "input_activations": activations,
        "output_activations": None,
    }
    return {
        "quant_method": "compressed-tensors",
        "format": layout,
        "quantization_status": "compressed",
        "config_groups": {"group_0": group},
        "ignore": ["lm_head"],
    }
