"""The vLLM internals the gateway relies on (`TOUCHPOINTS` of gateway/engine/vllm_seam.py),
checked against the installed vLLM at import and signature level, with no engine started: the
first step of a vLLM upgrade. One test per touchpoint; a failure names the touchpoint and what
vLLM changed. Needs only vLLM and pytest, so an upgrade drill runs it in an environment of its
own (docs/ARCHITECTURE.md, "The seam to vLLM")."""

from __future__ import annotations

import importlib
import inspect
import re
from types import SimpleNamespace
from typing import Any

import pytest

# Only vLLM's absence skips: a seam that no longer imports on the installed vLLM fails here.
pytest.importorskip("vllm", reason="the contract is with the installed vLLM")

from gateway.engine.vllm_seam import (
    APPLY_BITMASK,
    ASYNC_LLM,
    SCHEDULER,
    TOUCHPOINTS,
    SchedulerStatsLogger,
    StepScheduler,
    Touchpoint,
    Use,
    skip_masks_that_allow_every_token,
)

# Public names, but what gateway/engine/constraint_check.py builds on: an upgrade checks them too.
CONSTRAINT_CHECK = Touchpoint(
    "constraint_check.ConstraintChecker",
    (
        Use(
            "vllm.sampling_params:SamplingParams",
            "verify",
            ("model_config", "speculative_config", "structured_outputs_config", "tokenizer"),
        ),
        Use("vllm.sampling_params:SamplingParams", "structured_outputs"),
        Use(ASYNC_LLM, "vllm_config"),
        Use(ASYNC_LLM, "model_config"),
        Use(ASYNC_LLM, "tokenizer"),
        Use("vllm.config:VllmConfig", "speculative_config"),
        Use("vllm.config:VllmConfig", "structured_outputs_config"),
        # What the compile worker is given: the vocabulary's size, the whitespace setting, and
        # the constraint's fields, as the xgrammar backend reads them.
        Use("vllm.config:ModelConfig", "get_vocab_size", ()),
        Use("vllm.config:StructuredOutputsConfig", "disable_any_whitespace"),
        Use("vllm.sampling_params:StructuredOutputsParams", "json"),
        Use("vllm.sampling_params:StructuredOutputsParams", "json_object"),
        Use("vllm.sampling_params:StructuredOutputsParams", "regex"),
        Use("vllm.sampling_params:StructuredOutputsParams", "choice"),
        Use("vllm.sampling_params:StructuredOutputsParams", "grammar"),
    ),
)
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def owner_class(owner: str) -> type:
    module, _, name = owner.partition(":")
    found: type = getattr(importlib.import_module(module), name)
    return found


def _assigned(cls: type, name: str) -> bool:
    """Whether `cls` or a base sets `name`: a class attribute (an enum member, a property), a
    field or annotation (dataclass, msgspec Struct), or `self.name = ...` in its source."""
    try:
        inspect.getattr_static(cls, name)
        return True
    except AttributeError:
        pass
    assignment = re.compile(rf"self\.{re.escape(name)}\b\s*(:[^=\n]*)?=(?!=)")
    for klass in inspect.getmro(cls):
        if name in getattr(klass, "__annotations__", {}) or name in getattr(
            klass, "__struct_fields__", ()
        ):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):  # builtins, C extensions
            continue
        if assignment.search(source):
            return True
    return False


def _method_problem(cls: type, use: Use, expected: tuple[str, ...]) -> str | None:
    try:
        inspect.getattr_static(cls, use.name)
    except AttributeError:
        return "is gone"
    member = getattr(cls, use.name)
    if not callable(member):
        return "is no longer a method"
    parameters = list(inspect.signature(member).parameters.values())
    if parameters and parameters[0].name in ("self", "cls"):
        parameters = parameters[1:]
    positional = [p.name for p in parameters if p.kind in POSITIONAL]
    required = [
        p.name
        for p in parameters[len(expected) :]
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if positional[: len(expected)] != list(expected) or required:
        takes = ", ".join(p.name for p in parameters)
        return f"takes ({takes}); the seam passes ({', '.join(expected)})"
    return None


def problems(touchpoint: Touchpoint) -> list[str]:
    """What vLLM changed under `touchpoint`, one line per name (none: it holds)."""
    found = []
    for use in touchpoint.uses:
        where = f"{touchpoint.seam}: vLLM's {use.owner}.{use.name}"
        try:
            cls = owner_class(use.owner)
        except (ImportError, AttributeError) as e:
            found.append(f"{where}: {use.owner} cannot be imported ({e})")
            continue
        if use.parameters is None:
            if not _assigned(cls, use.name):
                found.append(f"{where}: {use.owner} no longer sets `{use.name}`")
        else:
            problem = _method_problem(cls, use, use.parameters)
            if problem:
                found.append(f"{where} {problem}")
    return found


@pytest.mark.parametrize("touchpoint", [*TOUCHPOINTS, CONSTRAINT_CHECK], ids=lambda t: t.seam)
def test_the_touchpoint_holds(touchpoint: Touchpoint) -> None:
    found = problems(touchpoint)
    assert not found, "\n".join(found)


def test_the_seams_classes_implement_every_abstract_method() -> None:
    for cls in (StepScheduler, SchedulerStatsLogger):
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        assert not missing, f"{cls.__name__}: vLLM's base class now also requires {missing}"


def test_a_change_in_vllm_is_named() -> None:
    renamed = Touchpoint(
        "preempt", (Use(SCHEDULER, "_preempt_request", ("request", "when")), Use(SCHEDULER, "gone"))
    )
    assert problems(renamed) == [
        f"preempt: vLLM's {SCHEDULER}._preempt_request takes (request, timestamp,"
        " drop_stale_output); the seam passes (request, when)",
        f"preempt: vLLM's {SCHEDULER}.gone: {SCHEDULER} no longer sets `gone`",
    ]
    more = Touchpoint("start", (Use(ASYNC_LLM, "_run_output_handler", ("loop",)),))
    assert problems(more) == [
        f"start: vLLM's {ASYNC_LLM}._run_output_handler takes (); the seam passes (loop)"
    ]
    moved = Touchpoint("x", (Use("vllm.v1.no_such_module:Scheduler", "running"),))
    assert "cannot be imported" in problems(moved)[0]


def test_the_compile_worker_reads_constraints_as_the_xgrammar_backend_does() -> None:
    """gateway/engine/constraint_check.py turns choices into the grammar vLLM builds for them
    and tells Lark from EBNF with vLLM's own functions: both must still be there."""
    from vllm.v1.structured_output.utils import choice_as_grammar, grammar_is_likely_lark

    assert choice_as_grammar(["yes", "no"]) == 'root ::= "yes" | "no"'
    assert grammar_is_likely_lark('start: "a"') and not grammar_is_likely_lark('root ::= "a"')


def test_the_worker_extension_loads_and_patches_the_runner() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from gateway.engine.engine_args import SEEDED_SAMPLING_ON_CPU
    from gateway.engine.vllm_seam import (
        discarded_draws_kept_off_cpu_generators,
        keep_discarded_draws_off_cpu_generators,
        masks_that_allow_every_token_skipped,
        skip_masks_that_allow_every_token,
    )

    assert isinstance(resolve_obj_by_qualname(SEEDED_SAMPLING_ON_CPU), type)
    assert discarded_draws_kept_off_cpu_generators()
    keep_discarded_draws_off_cpu_generators()  # again: vLLM may import the module twice
    assert discarded_draws_kept_off_cpu_generators()
    assert masks_that_allow_every_token_skipped()
    skip_masks_that_allow_every_token()
    assert masks_that_allow_every_token_skipped()


def test_the_runner_applies_grammar_masks_through_the_name_the_seam_wraps() -> None:
    """`skip_masks_that_allow_every_token` replaces the runner module's
    `apply_grammar_bitmask`: the runner must still call it by that name, with these
    parameters."""
    from vllm.v1.structured_output import utils
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    parameters = list(inspect.signature(utils.apply_grammar_bitmask).parameters)
    assert parameters == ["scheduler_output", "grammar_output", "input_batch", "logits"]
    assert "apply_grammar_bitmask(" in inspect.getsource(GPUModelRunner.sample_tokens)
    assert APPLY_BITMASK.partition(":")[0] == GPUModelRunner.__module__


def test_masks_that_allow_every_token_are_left_out_and_the_logits_are_the_same() -> None:
    import numpy
    import torch
    from vllm.v1.core.sched.output import GrammarOutput
    from vllm.v1.structured_output.utils import apply_grammar_bitmask
    from vllm.v1.worker import gpu_model_runner

    skip_masks_that_allow_every_token()
    runner: Any = gpu_model_runner  # the name is imported there, not exported
    apply = runner.apply_grammar_bitmask
    step: Any = SimpleNamespace(scheduled_spec_decode_tokens={})
    batch: Any = SimpleNamespace(req_ids=["free", "held", "also free"])
    bitmask = numpy.full((3, 2), -1, dtype=numpy.int32)
    bitmask[1] = [0b101, 0]  # "held": tokens 0 and 2 of 64 only
    output = GrammarOutput(["free", "held", "also free"], bitmask)
    logits = torch.randn(3, 64, dtype=torch.bfloat16)
    expected, patched = logits.clone(), logits.clone()
    apply_grammar_bitmask(step, output, batch, expected)  # vLLM's own
    apply(step, output, batch, patched)
    assert torch.equal(patched, expected)
    assert torch.isinf(patched[1]).sum() == 62 and not torch.isinf(patched[[0, 2]]).any()
    free = GrammarOutput(["free", "also free"], numpy.full((2, 2), -1, dtype=numpy.int32))
    no_logits: Any = None  # none needed: no row restricts, so nothing is applied
    apply(step, free, batch, no_logits)
