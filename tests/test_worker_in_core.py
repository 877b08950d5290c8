"""The model's worker inside the engine core's process, the default on a CPU machine of up to
two cores (issue 60, gateway/engine/cpu_defaults.py): the session's engine runs without a
worker process of its own, and answers greedy prompts token for token as an engine on vLLM's
multiprocess executor (the model's worker in a process apart) does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import psutil
import pytest

from gateway.engine.cpu_defaults import engine_environment
from protocols.generation import SamplingOptions
from serving import LoopThread, gateway_settings

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

pytestmark = pytest.mark.own_engine  # a second engine, on vLLM's multiprocess executor

IN_CORE = "VLLM_ENABLE_V1_MULTIPROCESSING"
GREEDY = SamplingOptions(do_sample=False, max_new_tokens=24)
ASKED = [
    [{"role": "user", "content": "Tell me about lighthouses."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "What is 12 times 7? Explain."}],
]


@pytest.fixture(scope="module")
def multiprocess_engine(loop_thread: LoopThread) -> Iterator[VllmEngine]:
    """The session engine's settings, the worker in a process of its own (vLLM's default)."""
    from gateway.engine.default_model import prepare_default_model
    from gateway.engine.vllm_engine import VllmEngine

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(IN_CORE, "1")  # the operator's own setting wins over the default
        model = str(prepare_default_model())
        built = loop_thread.run(VllmEngine.start(gateway_settings().engine, model))
    yield built
    loop_thread.call(built.shutdown)


def processes_under(loop_thread: LoopThread, engine: VllmEngine) -> int:
    """The processes the engine core started (its worker, where it has one apart)."""
    [pid] = loop_thread.call(engine.core_pids)
    return len(psutil.Process(pid).children(recursive=True))


def greedy(loop_thread: LoopThread, engine: VllmEngine) -> list[list[int]]:
    answers = []
    for asked in ASKED:
        prompt = engine.encode(engine.render_chat(asked))
        (step,) = loop_thread.run(engine.complete(prompt, GREEDY))
        answers.append(list(step.token_ids))
    return answers


def test_the_worker_runs_in_the_engine_cores_process_by_default_here(
    loop_thread: LoopThread, engine: VllmEngine, multiprocess_engine: VllmEngine
) -> None:
    if engine_environment({}).get(IN_CORE) != "0":
        pytest.skip("more than two cores here: vLLM's multiprocess executor is the default")
    apart = processes_under(loop_thread, multiprocess_engine)
    assert processes_under(loop_thread, engine) == apart - 1


def test_greedy_answers_are_the_same_token_for_token(
    loop_thread: LoopThread, engine: VllmEngine, multiprocess_engine: VllmEngine
) -> None:
    answers = greedy(loop_thread, engine)
    assert all(answers)
    assert answers == greedy(loop_thread, multiprocess_engine)
