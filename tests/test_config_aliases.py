"""LMI's and TGI's configuration names, and serving.properties, as load_settings reads them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gateway.config.loading import load_settings
from gateway.config.settings import ConfigError, Settings


def settings(**env: str) -> Settings:
    return load_settings(env, dotenv_path=None)


def setting(settings: Settings, name: str) -> Any:
    field = name.lower()
    if field in settings.engine.__struct_fields__:
        return getattr(settings.engine, field)
    return getattr(settings, field)


@pytest.mark.parametrize(
    ("name", "value", "setting_name", "expected"),
    [
        ("HF_MODEL_ID", "/models/llama", "MODEL", "/models/llama"),
        ("OPTION_MODEL_ID", "/models/llama", "MODEL", "/models/llama"),
        ("MODEL_ID", "/models/llama", "MODEL", "/models/llama"),
        ("OPTION_SERVED_MODEL_NAME", "chat", "SERVED_MODEL_NAME", "chat"),
        ("SERVING_LOAD_MODELS", "mini=default", "LOAD_MODELS", "mini=default"),
        ("OPTION_MAX_MODEL_LEN", "1024", "MAX_MODEL_LEN", 1024),
        ("MAX_TOTAL_TOKENS", "1024", "MAX_MODEL_LEN", 1024),
        ("TENSOR_PARALLEL_DEGREE", "2", "TENSOR_PARALLEL_SIZE", 2),
        ("OPTION_TENSOR_PARALLEL_DEGREE", "2", "TENSOR_PARALLEL_SIZE", 2),
        ("OPTION_TENSOR_PARALLEL_SIZE", "2", "TENSOR_PARALLEL_SIZE", 2),
        ("NUM_SHARD", "2", "TENSOR_PARALLEL_SIZE", 2),
        ("OPTION_PIPELINE_PARALLEL_DEGREE", "2", "PIPELINE_PARALLEL_SIZE", 2),
        ("MAX_BATCH_SIZE", "8", "MAX_RUNNING_REQUESTS", 8),
        ("OPTION_MAX_ROLLING_BATCH_SIZE", "8", "MAX_RUNNING_REQUESTS", 8),
        ("OPTION_MAX_NUM_SEQS", "8", "MAX_RUNNING_REQUESTS", 8),
        ("OPTION_DTYPE", "fp16", "DTYPE", "float16"),
        ("OPTION_DTYPE", "bf16", "DTYPE", "bfloat16"),
        ("OPTION_ENABLE_PREFIX_CACHING", "false", "ENABLE_PREFIX_CACHING", False),
        ("OPTION_ENFORCE_EAGER", "true", "ENFORCE_EAGER", True),
        ("OPTION_SEED", "7", "SEED", 7),
        ("OPTION_KV_CACHE_MEMORY_BYTES", str(512 << 20), "KV_CACHE_GIB", 0.5),
        ("MAX_INPUT_TOKENS", "1023", "MAX_MODEL_LEN", 1024),
        ("MAX_INPUT_LENGTH", "1023", "MAX_MODEL_LEN", 1024),
        ("MAX_CONCURRENT_REQUESTS", "300", "MAX_WAITING_REQUESTS", 300 - 256),
        ("PORT", "9000", "PORT", 9000),
        ("HOSTNAME", "0.0.0.0", "HOST", "0.0.0.0"),
        ("HOSTNAME", "::", "HOST", "::"),
        ("DTYPE", "bfloat16", "DTYPE", "bfloat16"),
        ("SAGEMAKER_MODEL_SERVER_TIMEOUT", "90", "REQUEST_TIMEOUT_SECONDS", 90.0),
        ("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", "90", "REQUEST_TIMEOUT_SECONDS", 90.0),
    ],
)
def test_each_name_sets_its_setting(
    name: str, value: str, setting_name: str, expected: object
) -> None:
    assert setting(settings(), setting_name) != expected
    assert setting(settings(**{name: value}), setting_name) == expected


def test_the_gateways_own_name_wins_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "gateway.config"):
        chosen = settings(MAX_MODEL_LEN="2048", OPTION_MAX_MODEL_LEN="1024", MODEL_ID="/m")
    assert chosen.engine.max_model_len == 2048 and chosen.engine.model == "/m"
    assert "MAX_MODEL_LEN=2048 wins over OPTION_MAX_MODEL_LEN=1024" in caplog.text


@pytest.mark.parametrize(
    "env",
    [
        {"HF_MODEL_ID": "/a", "MODEL_ID": "/b"},
        {"OPTION_TENSOR_PARALLEL_DEGREE": "2", "NUM_SHARD": "4"},
        {"MAX_INPUT_TOKENS": "100", "MAX_INPUT_LENGTH": "200"},
        {"OPTION_MAX_ROLLING_BATCH_SIZE": "8", "MAX_BATCH_SIZE": "16"},
    ],
)
def test_two_names_with_two_values_stop_start_up_naming_both(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as caught:
        settings(**env)
    for name, value in env.items():
        assert f"{name}={value}" in str(caught.value)


def test_names_that_agree_are_fine() -> None:
    chosen = settings(
        OPTION_DTYPE="bf16", DTYPE="bfloat16", NUM_SHARD="1", TENSOR_PARALLEL_DEGREE="1"
    )
    assert chosen.engine.dtype == "bfloat16" and chosen.engine.tensor_parallel_size == 1


def test_an_invalid_value_names_the_users_own_variable() -> None:
    with pytest.raises(ConfigError, match=r"^OPTION_MAX_MODEL_LEN: "):
        settings(OPTION_MAX_MODEL_LEN="long")
    with pytest.raises(ConfigError, match=r"^NUM_SHARD: "):
        settings(NUM_SHARD="0")


def test_serving_properties_in_the_model_directory(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    (tmp_path / "serving.properties").write_text(
        "# LMI\nengine=Python\noption.rolling_batch=vllm\noption.model_id=weights\n"
        "option.max_model_len = 1024\noption.tensor_parallel_degree: 1\n"
        "option.enforce_eager=true\noption.tgi_compat=true\n"
    )
    chosen = settings(SAGEMAKER_MODEL_DIR=str(tmp_path))
    assert chosen.engine.model == str(tmp_path / "weights")
    assert chosen.engine.max_model_len == 1024 and chosen.engine.enforce_eager
    assert chosen.option_tgi_compat is True
    with pytest.raises(ConfigError) as caught:
        settings(SAGEMAKER_MODEL_DIR=str(tmp_path), OPTION_MAX_MODEL_LEN="2048")
    assert "option.max_model_len=1024" in str(caught.value)
    assert "OPTION_MAX_MODEL_LEN=2048" in str(caught.value)


def test_a_model_in_the_model_directory_is_served(tmp_path: Path) -> None:
    assert settings(SAGEMAKER_MODEL_DIR=str(tmp_path)).engine.model == ""
    (tmp_path / "config.json").write_text("{}")
    assert settings(SAGEMAKER_MODEL_DIR=str(tmp_path)).engine.model == str(tmp_path)
    assert settings(SAGEMAKER_MODEL_DIR=str(tmp_path), HF_MODEL_ID="/x").engine.model == "/x"


def test_options_the_gateway_cannot_honour_are_logged_by_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "gateway.config"):
        settings(
            OPTION_GPU_MEMORY_UTILIZATION="0.9",
            OPTION_SPECULATIVE_CONFIG="{}",
            SAGEMAKER_MODEL_SERVER_WORKERS="2",
            OPTION_ROLLING_BATCH="vllm",
            OPTION_TGI_COMPAT="true",
        )
    for name in (
        "OPTION_GPU_MEMORY_UTILIZATION=0.9",
        "OPTION_SPECULATIVE_CONFIG={}",
        "SAGEMAKER_MODEL_SERVER_WORKERS=2",
    ):
        assert name in caplog.text
    assert "OPTION_ROLLING_BATCH" not in caplog.text and "OPTION_TGI_COMPAT" not in caplog.text


def test_the_prefill_budget_names_set_the_engines_tokens_per_step() -> None:
    assert settings(MAX_BATCH_PREFILL_TOKENS="4096").engine.max_num_batched_tokens == 4096
    lmi = settings(OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS="8192")
    assert lmi.engine.max_num_batched_tokens == 8192


def test_a_hostname_that_is_a_name_does_not_move_the_server() -> None:
    assert settings(HOSTNAME="pod-7f9c").host == "127.0.0.1"


def test_tgi_input_and_total_bounds() -> None:
    assert settings(MAX_INPUT_TOKENS="1023", MAX_TOTAL_TOKENS="1024").engine.max_model_len == 1024
    with pytest.raises(ConfigError) as caught:
        settings(MAX_INPUT_TOKENS="1024", MAX_TOTAL_TOKENS="1024")
    assert "MAX_INPUT_TOKENS=1024" in str(caught.value)
    assert "MAX_TOTAL_TOKENS=1024" in str(caught.value)


def test_requests_in_flight_are_running_plus_waiting() -> None:
    small = settings(MAX_CONCURRENT_REQUESTS="16")
    assert (small.max_running_requests, small.max_waiting_requests) == (16, 0)
    split = settings(MAX_CONCURRENT_REQUESTS="100", MAX_BATCH_SIZE="32")
    assert (split.max_running_requests, split.max_waiting_requests) == (32, 68)
    with pytest.raises(ConfigError) as caught:
        settings(MAX_CONCURRENT_REQUESTS="16", MAX_RUNNING_REQUESTS="32")
    assert "MAX_CONCURRENT_REQUESTS=16" in str(caught.value)
    assert "MAX_RUNNING_REQUESTS=32" in str(caught.value)


def test_an_s3_model_is_refused_with_where_to_put_it() -> None:
    with pytest.raises(ConfigError, match=r"^HF_MODEL_ID=s3://bucket/m: .*ModelDataUrl"):
        settings(HF_MODEL_ID="s3://bucket/m")
