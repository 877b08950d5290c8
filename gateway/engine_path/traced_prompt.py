"""One prompt's span on its request's trace (gateway/observability/tracing.py): what the
engine path asks of the engine and what came back. `traced_prompt` is None when the request
is untraced (tracing off): the engine path then does nothing more for traces."""

from __future__ import annotations

import msgspec

from gateway.observability.tracing import Span, Trace, current_trace
from protocols.errors import ErrorKind
from protocols.events import Delta, Event, Failed, Finished
from protocols.generation import GenerationRequest
from protocols.names import Protocol


class TracedPrompt:
    __slots__ = ("_ended_how", "_first", "span", "trace")

    def __init__(self, trace: Trace, span: Span) -> None:
        self.trace = trace
        self.span = span  # the engine's and the admission's spans are its children
        self._first = True
        self._ended_how = "interrupted"  # until it finishes or fails

    def saw(self, event: Event) -> None:
        """An event of the prompt on its way to the protocol."""
        if isinstance(event, Delta):
            if self._first and event.token_ids:
                self._first = False
                self.span.event("llm_gateway.first_token")
        elif isinstance(event, Finished):
            self._ended_how = "finished"
            reasons = [s.finish_reason for s in event.sequences]
            output = sum(s.generated_tokens for s in event.sequences)
            self.span.update(
                {
                    "gen_ai.usage.input_tokens": event.prompt_tokens,
                    "gen_ai.usage.output_tokens": output,
                    "gen_ai.usage.cache_read.input_tokens": event.cached_tokens,
                    "gen_ai.response.finish_reasons": reasons,
                }
            )
            if event.sequences:
                self.span.content("llm_gateway.output.text", event.sequences[0].text)
            self.trace.finished(event.prompt_tokens, output, event.cached_tokens, reasons)
        elif isinstance(event, Failed):
            self.failed(event.kind, event.message)

    def embedded(self, input_tokens: int) -> None:
        """An embedding request's inputs were embedded: their tokens are its usage."""
        self._ended_how = "finished"
        self.span.set("gen_ai.usage.input_tokens", input_tokens)
        self.trace.finished(input_tokens, 0, 0, [])

    def failed(self, kind: ErrorKind, message: str) -> None:
        self._ended_how = "failed"
        self.span.fail(kind.value, message)
        self.trace.fail(kind.value, message)

    def end(self) -> None:
        self.span.set("llm_gateway.outcome", self._ended_how)
        self.span.end()


def traced_prompt(
    request: GenerationRequest, protocol: Protocol, model: str | None, key_name: str
) -> TracedPrompt | None:
    """The prompt's span, under its request's server span (named by the first prompt)."""
    trace = current_trace()
    if trace is None:
        return None
    operation = "chat" if request.messages is not None else "text_completion"
    trace.generation(operation, model or "", protocol.value, key_name, request.adapter)
    options = request.options
    attributes: dict[str, str | int | float | bool] = {
        "gen_ai.operation.name": operation,
        "llm_gateway.prompt.index": request.index,
        "gen_ai.request.max_tokens": options.max_new_tokens,
        "gen_ai.request.temperature": options.temperature,
        "gen_ai.request.top_p": options.top_p,
        "llm_gateway.stream": request.stream,
    }
    if options.n > 1:
        attributes["gen_ai.request.choice.count"] = options.n
    if options.num_beams > 1:
        attributes["llm_gateway.request.num_beams"] = options.num_beams
    if request.request_id is not None:
        attributes["llm_gateway.request_id"] = request.request_id
    span = trace.span.child("llm_gateway.generate", attributes)
    if span.wants_content:
        if request.messages is not None:
            text = msgspec.json.encode(request.messages).decode()
        else:
            text = request.prompt or (request.history.text if request.history else "")
        span.content("llm_gateway.prompt.text", text)
    return TracedPrompt(trace, span)


def traced_embedding(model: str, inputs: int, key_name: str) -> TracedPrompt | None:
    """An embedding request's span (its inputs as one), under its request's server span."""
    trace = current_trace()
    if trace is None:
        return None
    trace.generation("embeddings", model, "", key_name, None)
    attributes: dict[str, str | int] = {
        "gen_ai.operation.name": "embeddings",
        "llm_gateway.inputs": inputs,
    }
    return TracedPrompt(trace, trace.span.child("llm_gateway.embed", attributes))
