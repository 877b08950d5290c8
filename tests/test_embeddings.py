"""The embedding model served beside the chat model, on the real engines, called by the real
clients: the `openai` SDK's embeddings (float and base64) and the vectors sentence-transformers
computes for the same model directory."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import openai
import pytest

from clients import wait_for, web
from serving import RunningServer

if TYPE_CHECKING:
    from gateway.engine.pooling_engine import PoolingEngine

CAT, FELINE, STOCKS = (
    "The cat sat on the mat.",
    "A feline rested on a rug.",
    "Stock markets fell sharply today.",
)
TEXTS = [CAT, FELINE, STOCKS]
NAME = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def oai(embedding_server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url=embedding_server.http + "/v1", max_retries=0)


def _vectors(answer: Any) -> np.ndarray[Any, Any]:
    return np.array([d.embedding for d in answer.data], dtype=np.float64)


def test_the_openai_sdk_embeds_in_base64_and_float(oai: openai.OpenAI) -> None:
    """Unit-length 384-dimension vectors, a cat closer to a feline than to stocks; base64 (the
    SDK's default) and floats the same vectors."""
    base64 = oai.embeddings.create(model=NAME, input=TEXTS)
    floats = oai.embeddings.create(model=NAME, input=TEXTS, encoding_format="float")
    assert [d.index for d in base64.data] == [0, 1, 2] and base64.model == NAME
    a, b = _vectors(base64), _vectors(floats)
    assert a.shape == (3, 384)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert np.allclose(a, b, atol=1e-6)
    assert a[0] @ a[1] > 0.4 > 0.15 > a[0] @ a[2]
    assert base64.usage.prompt_tokens == base64.usage.total_tokens > 3 * 2


def test_equal_texts_embed_equally_alone_or_in_a_batch(oai: openai.OpenAI) -> None:
    alone = _vectors(oai.embeddings.create(model=NAME, input=CAT))
    batch = _vectors(oai.embeddings.create(model=NAME, input=[STOCKS, CAT, CAT]))
    assert np.allclose(alone[0], batch[1], atol=1e-5) and np.allclose(batch[1], batch[2])


def test_the_vectors_are_sentence_transformers_own(oai: openai.OpenAI) -> None:
    from sentence_transformers import SentenceTransformer

    from gateway.engine.pooling_engine import default_embedding_model

    reference = SentenceTransformer(str(default_embedding_model()), device="cpu")
    expected = reference.encode(TEXTS, normalize_embeddings=True)
    served = _vectors(oai.embeddings.create(model=NAME, input=TEXTS))
    for got, want in zip(served, expected, strict=True):
        assert float(got @ want) / float(np.linalg.norm(want)) >= 0.999


def test_a_text_past_the_context_is_refused_unless_cut(
    embedding_server: RunningServer, oai: openai.OpenAI
) -> None:
    long = "word " * 600
    with pytest.raises(openai.BadRequestError) as refused:
        oai.embeddings.create(model=NAME, input=["short", long])
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == "input[1]"  # type: ignore[index]
    cut = web.post(
        embedding_server.http + "/v1/embeddings",
        json={"model": NAME, "input": [long], "truncate_prompt_tokens": -1},
    )
    assert cut.status_code == 200, cut.text
    assert cut.json()["usage"]["prompt_tokens"] == 256
    kept = web.post(
        embedding_server.http + "/v1/embeddings",
        json={"input": long, "truncate_prompt_tokens": 10},
    )
    assert kept.json()["usage"]["prompt_tokens"] == 10


def test_the_chat_model_and_unknown_models_are_refused(
    embedding_server: RunningServer, oai: openai.OpenAI
) -> None:
    chat_model = embedding_server.gateway.model.name
    with pytest.raises(openai.BadRequestError) as refused:
        oai.embeddings.create(model=chat_model, input="hi")
    assert refused.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="no-such-model", input="hi")
    bodies: list[dict[str, Any]] = [{"input": []}, {"model": NAME}, {"input": ["x"] * 10_000}]
    for body in bodies:
        answer = web.post(embedding_server.http + "/v1/embeddings", json=body)
        assert answer.status_code == 400, (body, answer.text)
        assert answer.json()["error"]["type"] == "invalid_request_error"
        assert answer.json()["error"]["param"] == "input", answer.text


def test_chat_still_works_beside_the_embedding_model(embedding_server: RunningServer) -> None:
    answer = web.post(
        embedding_server.http + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]


def test_the_models_list_has_the_embedding_model_and_its_task(oai: openai.OpenAI) -> None:
    listed = {m.id: m for m in oai.models.list()}
    assert getattr(listed[NAME], "task", None) == "embed"
    assert getattr(listed[NAME], "max_model_len", None) == 256


def test_a_keys_token_limit_counts_the_tokens_it_embedded(
    make_embedding_server: Callable[..., RunningServer],
) -> None:
    """Embeddings go through the per-key limits: the tokens embedded count towards the key's
    tokens a minute, and the request past it is refused in OpenAI's shape, with Retry-After;
    another key's requests go on."""
    server = make_embedding_server(API_KEYS="one,two", LIMIT_TOKENS_PER_MINUTE="20")
    one = openai.OpenAI(api_key="one", base_url=server.http + "/v1", max_retries=0)
    first = one.embeddings.create(model=NAME, input="word " * 30)
    assert first.usage.prompt_tokens > 20
    with pytest.raises(openai.RateLimitError) as refused:
        one.embeddings.create(model=NAME, input="hi")
    assert refused.value.status_code == 429
    assert int(refused.value.response.headers["retry-after"]) >= 1
    assert refused.value.body["type"] == "rate_limit_error"  # type: ignore[index]
    two = openai.OpenAI(api_key="two", base_url=server.http + "/v1", max_retries=0)
    assert len(two.embeddings.create(model=NAME, input="hi").data) == 1


def test_a_keys_requests_a_minute_count_embeddings(
    make_embedding_server: Callable[..., RunningServer],
) -> None:
    server = make_embedding_server(API_KEYS="one", LIMIT_REQUESTS_PER_MINUTE="2")
    one = openai.OpenAI(api_key="one", base_url=server.http + "/v1", max_retries=0)
    for _ in range(2):
        one.embeddings.create(model=NAME, input="hi")
    with pytest.raises(openai.RateLimitError):
        one.embeddings.create(model=NAME, input="hi")


def test_embeddings_go_through_admission(embedding_server: RunningServer) -> None:
    """Each request holds an admission slot while it embeds (bulk unless it asks otherwise),
    and gives it back."""
    admission = embedding_server.gateway.service.admission
    answer = web.post(
        embedding_server.http + "/v1/embeddings", json={"input": ["a", "b"], "priority": 0}
    )
    assert answer.status_code == 200, answer.text
    assert admission.running == 0 and admission.waiting == 0


def test_a_chat_naming_the_embedding_model_is_refused_naming_model(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    body: Any = refused.value.body
    assert body["param"] == "model" and "embeds; it does not generate" in body["message"]
    with pytest.raises(openai.BadRequestError) as completion:
        oai.completions.create(model=NAME, prompt="Hi", max_tokens=2)
    assert completion.value.body["param"] == "model"  # type: ignore[index]


@pytest.mark.long  # 2,048 inputs through the embedding engine
def test_many_inputs_in_one_request_let_another_callers_embedding_through(
    embedding_server: RunningServer, embedding_engine: PoolingEngine
) -> None:
    """2,048 inputs in one request are in the engine two engine batches at a time (2 x
    EMBEDDING_MAX_NUM_SEQS, 64): another caller's embedding, sent while they run, is answered
    before they end, rather than behind all of them."""
    client = openai.OpenAI(api_key="k", base_url=embedding_server.http + "/v1", max_retries=0)
    many = [f"{i} " + "word " * 30 for i in range(2048)]
    with ThreadPoolExecutor(1) as pool:
        flood = pool.submit(client.embeddings.create, model=NAME, input=many)
        wait_for(lambda: embedding_engine.unfinished_requests() > 0)
        assert embedding_engine.unfinished_requests() <= 128
        other = client.embeddings.create(model=NAME, input=CAT)
        assert len(other.data) == 1
        assert not flood.done()
        assert len(flood.result().data) == 2048
