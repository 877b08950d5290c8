"""gateway_bench/quantize.py: the quantized copies `llm-gateway bench quantized` measures are in
the layouts vLLM reads (its own unpacking gives the values back; its compressed-tensors config
takes the checkpoint's `quantization_config`), and dequantize close to the weights they came from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("aiohttp", reason="the bench extra is not installed")
pytest.importorskip("vllm", reason="vLLM is not installed")
quantize = pytest.importorskip("gateway_bench.quantize")
INT4_GROUP = quantize.INT4_GROUP
int4_per_group = quantize.int4_per_group
int8_per_channel = quantize.int8_per_channel
packed_int4 = quantize.packed_int4
quantization_config = quantize.quantization_config
quantized_checkpoint = quantize.quantized_checkpoint


def _weight(rows: int = 64, columns: int = 96) -> torch.Tensor:
    return (torch.randn(rows, columns, generator=torch.Generator().manual_seed(0)) / 20).to(
        torch.bfloat16
    )


def test_int4_values_pack_as_vllms_uint4b8_unpacks_them() -> None:
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        unpack_quantized_values_into_int32,
    )
    from vllm.scalar_type import scalar_types

    values, _ = int4_per_group(_weight())
    unpacked = unpack_quantized_values_into_int32(packed_int4(values), scalar_types.uint4b8, 1)
    assert torch.equal(unpacked - 8, values)


def test_int4_groups_dequantize_close_to_the_weight() -> None:
    weight = _weight()
    values, scale = int4_per_group(weight)
    assert scale.shape == (64, 96 // INT4_GROUP) and scale.dtype == torch.bfloat16
    assert int(values.min()) >= -8 and int(values.max()) <= 7
    groups = values.reshape(64, -1, INT4_GROUP).float() * scale.float().unsqueeze(-1)
    error = ((groups.reshape(64, 96) - weight.float()) ** 2).sum() / (weight.float() ** 2).sum()
    assert error < 0.02


def test_int8_channels_dequantize_close_to_the_weight() -> None:
    weight = _weight()
    values, scale = int8_per_channel(weight)
    assert values.dtype == torch.int8 and scale.shape == (64, 1)
    error = ((values.float() * scale - weight.float()) ** 2).sum() / (weight.float() ** 2).sum()
    assert error < 1e-3


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_vllm_reads_the_quantization_config(form: str) -> None:
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    config = CompressedTensorsConfig.from_config(quantization_config(form))
    assert config.ignore == ["lm_head"]
    assert config.target_scheme_map["Linear"]["weights"].num_bits == (8 if form == "int8" else 4)


def test_a_checkpoints_linear_layers_are_quantized_and_the_rest_kept(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    source = tmp_path / "source"
    source.mkdir()
    layer = "model.layers.0"
    save_file(
        {
            "model.embed_tokens.weight": _weight(32, 96),
            f"{layer}.input_layernorm.weight": torch.ones(96, dtype=torch.bfloat16),
            f"{layer}.self_attn.q_proj.weight": _weight(),
        },
        source / "model.safetensors",
    )
    (source / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (source / "tokenizer.json").write_text("{}")
    made = quantized_checkpoint(source, tmp_path / "int4", "int4")
    tensors = load_file(made / "model.safetensors")
    assert set(tensors) == {
        "model.embed_tokens.weight",
        f"{layer}.input_layernorm.weight",
        f"{layer}.self_attn.q_proj.weight_packed",
        f"{layer}.self_attn.q_proj.weight_scale",
        f"{layer}.self_attn.q_proj.weight_shape",
    }
    assert tensors[f"{layer}.self_attn.q_proj.weight_shape"].tolist() == [64, 96]
    config = json.loads((made / "config.json").read_text())
    assert config["quantization_config"]["format"] == "pack-quantized"
    assert (made / "tokenizer.json").is_file()


def test_agreement_counts_equal_answers_and_the_shared_head() -> None:
    from gateway_bench.quantized_bench import agreement

    reference = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert agreement(reference, reference) == (2, 1.0)
    assert agreement([[1, 2, 3, 4], [5, 6, 0, 8]], reference) == (1, 0.75)
    assert agreement([[1, 2], [9]], reference) == (0, 0.25)
