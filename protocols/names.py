"""One name per protocol: routes, metric labels and the bench all use these."""

from __future__ import annotations

import enum


class Protocol(enum.StrEnum):
    WS = "ws"  # WS /ws, batch-events-ws.md
    API_GENERATE_ONE = "api_generate_one"  # POST /api/generate-one, rest-generate.md
    API_GENERATE_BATCH = "api_generate_batch"  # POST /api/generate-batch, rest-generate.md
    WS_EVENTS = "ws_events"  # WS /ws/events, start-progress-ws.md
    CONTROL = "control"  # WS /generate, control-ws.md
    V1_GENERATE = "v1_generate"  # POST /v1/generate, control-ws.md's REST form
    LMI = "lmi"  # POST /invocations and /predictions/{model}, lmi-invocations.md
    SAGEMAKER = "sagemaker"  # the SageMaker runtime paths boto3 calls (LMI schema)
    TGI = "tgi"  # TGI's POST /, /generate, /generate_stream
    OPENAI_CHAT = "openai_chat"  # POST /v1/chat/completions (also TGI's Messages API)
    OPENAI_COMPLETIONS = "openai_completions"  # POST /v1/completions
    OPENAI_RESPONSES = "openai_responses"  # POST /v1/responses (OpenAI's Responses API)
    ANTHROPIC_MESSAGES = "anthropic_messages"  # POST /v1/messages (Anthropic's Messages API)
    COHERE_CHAT = "cohere_chat"  # POST /v2/chat (Cohere's chat)
    OLLAMA = "ollama"  # POST /api/chat and /api/generate (Ollama's API)
