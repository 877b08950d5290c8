"""Every embedding family on the real engines: the clients that call them unchanged
(langchain-openai's `OpenAIEmbeddings`, `litellm.embedding`), and bad input answered in the
family's own shape, never a 5xx: no input, 10,000 inputs, a text past the context (cut where
the request asks, refused otherwise; a text of megabytes too), an unknown model, the chat
model asked to embed, a vector per token past the batch's tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import openai
import pytest

from clients import web
from serving import RunningServer

SERVED = "all-MiniLM-L6-v2"
TEXTS = ["The cat sat on the mat.", "A feline rested on a rug.", "Stock markets fell sharply."]
TOO_LONG = "word " * 300  # past the model's 256 tokens
MANY = ["a"] * 10_000
V2_RERANK = "/v2/rerank"
LONG_SOURCE = {"inputs": {"source_sentence": TOO_LONG, "sentences": ["a"]}}


def _openai_shape(body: Any) -> bool:
    return set(body) == {"error"} and {"message", "type", "param"} <= set(body["error"])


def _tei_shape(body: Any) -> bool:
    return isinstance(body, dict) and set(body) == {"error", "error_type"}


def _cohere_shape(body: Any) -> bool:
    return isinstance(body, dict) and set(body) == {"id", "message"}


SHAPES = {"openai": _openai_shape, "tei": _tei_shape, "cohere": _cohere_shape}


def test_langchain_openai_embeddings(embedding_server: RunningServer) -> None:
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model=SERVED,
        base_url=embedding_server.http + "/v1",
        api_key="k",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,  # texts, not tiktoken's ids (docs/EMBEDDINGS.md)
        max_retries=0,
    )
    documents = np.array(embeddings.embed_documents(TEXTS))
    query = np.array(embeddings.embed_query(TEXTS[0]))
    assert documents.shape == (3, 384)
    assert np.allclose(np.linalg.norm(documents, axis=1), 1.0, atol=1e-5)
    assert np.allclose(query, documents[0], atol=1e-5)
    assert query @ documents[1] > query @ documents[2]


def test_litellm_embedding(embedding_server: RunningServer) -> None:
    import litellm

    answer = litellm.embedding(
        model=f"openai/{SERVED}",
        api_base=embedding_server.http + "/v1",
        api_key="k",
        input=TEXTS,
    )
    vectors = np.array([d["embedding"] for d in answer.data])
    assert vectors.shape == (3, 384)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert answer.usage is not None and answer.usage.prompt_tokens > 3 * 2


@pytest.mark.parametrize(
    ("path", "body", "status", "family", "field"),
    [
        # no input
        ("/v1/embeddings", {"model": SERVED, "input": []}, 400, "openai", "input"),
        ("/embed", {"inputs": []}, 400, "tei", "inputs"),
        ("/v2/embed", {"model": SERVED, "texts": []}, 400, "cohere", "texts"),
        ("/pooling", {"model": SERVED, "input": []}, 400, "openai", "input"),
        ("/score", {"model": SERVED, "text_1": "a", "text_2": []}, 400, "openai", "text_2"),
        ("/v1/rerank", {"query": "a", "documents": []}, 400, "openai", "documents"),
        (V2_RERANK, {"model": SERVED, "query": "a", "documents": []}, 400, "cohere", "documents"),
        # 10,000 inputs
        ("/v1/embeddings", {"model": SERVED, "input": MANY}, 400, "openai", "input"),
        ("/embed", {"inputs": MANY}, 422, "tei", "inputs"),
        ("/v2/embed", {"model": SERVED, "texts": MANY}, 400, "cohere", "texts"),
        ("/pooling", {"model": SERVED, "input": MANY}, 400, "openai", "input"),
        ("/rerank", {"query": "a", "texts": MANY}, 422, "tei", "texts"),
        ("/v1/rerank", {"query": "a", "documents": MANY}, 400, "openai", "documents"),
        (V2_RERANK, {"model": SERVED, "query": "a", "documents": MANY}, 400, "cohere", "documents"),
        # a text past the context, no truncation asked
        ("/v1/embeddings", {"input": ["a", TOO_LONG]}, 400, "openai", "input[1]"),
        ("/embed", {"inputs": ["a", TOO_LONG], "truncate": False}, 422, "tei", "inputs[1]"),
        ("/v2/embed", {"texts": [TOO_LONG], "truncate": "NONE"}, 400, "cohere", "texts[0]"),
        ("/pooling", {"input": [TOO_LONG]}, 400, "openai", "input[0]"),
        ("/similarity", LONG_SOURCE, 422, "tei", "inputs.source_sentence"),
        # an unknown model
        ("/v1/embeddings", {"model": "no-such", "input": "a"}, 404, "openai", "model"),
        ("/v2/embed", {"model": "no-such", "texts": ["a"]}, 404, "cohere", "model"),
        ("/pooling", {"model": "no-such", "input": "a"}, 404, "openai", "model"),
        ("/score", {"model": "no-such", "text_1": "a", "text_2": "b"}, 404, "openai", "model"),
        (V2_RERANK, {"model": "no-such", "query": "a", "documents": ["b"]}, 404, "cohere", "model"),
    ],
)  # fmt: skip
def test_bad_input_in_each_familys_shape(
    embedding_server: RunningServer,
    path: str,
    body: dict[str, Any],
    status: int,
    family: str,
    field: str,
) -> None:
    answer = web.post(embedding_server.http + path, json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert SHAPES[family](error), error
    if family == "openai":
        assert error["error"]["param"] == field
    else:
        message = error["message"] if family == "cohere" else error["error"]
        assert f"`{field}`" in message, message


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"input": TOO_LONG, "truncate_prompt_tokens": -1}),
        ("/embed", {"inputs": TOO_LONG, "truncate": True}),
        ("/embed", {"inputs": TOO_LONG, "truncate": True, "truncation_direction": "Left"}),
        ("/v2/embed", {"texts": [TOO_LONG], "truncate": "END"}),
        ("/pooling", {"input": TOO_LONG, "truncate_prompt_tokens": -1}),
        ("/rerank", {"query": "a", "texts": [TOO_LONG], "truncate": True}),
        ("/score", {"text_1": "a", "text_2": TOO_LONG, "truncate_prompt_tokens": -1}),
    ],
)
def test_a_text_past_the_context_is_cut_where_asked(
    embedding_server: RunningServer, path: str, body: dict[str, Any]
) -> None:
    answer = web.post(embedding_server.http + path, json=body)
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    ("path", "body", "family"),
    [
        ("/v2/embed", {"texts": ["a"]}, "cohere"),
        ("/pooling", {"input": "a"}, "openai"),
        ("/score", {"text_1": "a", "text_2": "b"}, "openai"),
        ("/v1/rerank", {"query": "a", "documents": ["b"]}, "openai"),
    ],
)
def test_the_chat_model_is_refused_naming_model(
    embedding_server: RunningServer, path: str, body: dict[str, Any], family: str
) -> None:
    chat_model = embedding_server.gateway.model.name
    answer = web.post(embedding_server.http + path, json={**body, "model": chat_model})
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert SHAPES[family](error)
    if family == "openai":
        assert error["error"]["param"] == "model"
        assert "does not embed" in error["error"]["message"]
    else:
        assert "does not embed" in error["message"] and "`model`" in error["message"]


def test_the_shared_paths_keep_the_chat_models_protocols(embedding_server: RunningServer) -> None:
    """`/`, `/invocations`, `/tokenize` and `/info` answer the chat model's protocols for
    their bodies (a generation sends `parameters`), TEI's for TEI's."""
    http = embedding_server.http
    generation = {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}
    tgi = web.post(http + "/", json=generation)
    assert tgi.status_code == 200 and "generated_text" in tgi.json()[0], tgi.text
    lmi = web.post(http + "/invocations", json=generation)
    assert lmi.status_code == 200 and "generated_text" in lmi.json(), lmi.text
    assert len(web.post(http + "/", json={"inputs": "Hi"}).json()[0]) == 384  # TEI's embed
    vllm = web.post(http + "/tokenize", json={"prompt": "Hi"})
    assert vllm.status_code == 200 and vllm.json()["count"] >= 1, vllm.text
    info = web.get(http + "/info").json()
    assert info["model_id"] != SERVED and "max_total_tokens" in info  # TGI's, the chat model's
    tei_info = web.get(http + "/info", params={"model": SERVED}).json()
    assert tei_info["served_model_name"] == SERVED and tei_info["max_input_length"] == 256


def test_a_text_of_megabytes_is_refused_or_cut_as_a_short_one_is(
    embedding_server: RunningServer,
) -> None:
    """A 3.6 MB input (700,000 tokens) is refused with OpenAI's context error naming it, as
    a text just past the context is; cut at the left, its vector is its last tokens' own, as
    the whole text's tokenization gives them (it is tokenized only as far as the cut needs:
    tests/test_bounded_tokens.py)."""
    client = openai.OpenAI(api_key="k", base_url=embedding_server.http + "/v1", max_retries=0)
    ending = " The cat sat on the mat."
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=SERVED, input="alpha " * 600_000 + ending)
    error: Any = refused.value.body
    assert error["param"] == "input" and error["code"] == "context_length_exceeded"
    cut = {"truncate_prompt_tokens": -1, "truncation_side": "left"}
    vectors = [
        client.embeddings.create(model=SERVED, input=text, encoding_format="float", extra_body=cut)
        for text in ("alpha " * 600_000 + ending, "alpha " * 300 + ending)
    ]
    assert [v.usage.prompt_tokens for v in vectors] == [256, 256]
    assert np.allclose(vectors[0].data[0].embedding, vectors[1].data[0].embedding, atol=1e-6)


def test_a_vector_per_token_is_bounded_by_the_batch_tokens(
    make_embedding_server: Callable[..., RunningServer],
) -> None:
    """TEI's `/embed_all` and vLLM's `token_embed` answer a vector per token: past
    EMBEDDING_MAX_NUM_BATCHED_TOKENS tokens in one request (TEI's max_batch_tokens, as /info
    reports it) they are refused in the family's shape naming the inputs, where a vector per
    input is still answered."""
    server = make_embedding_server(EMBEDDING_MAX_NUM_BATCHED_TOKENS="64")
    texts = ["word " * 40] * 2  # 84 tokens with the special ones
    tei = web.post(server.http + "/embed_all", json={"inputs": texts})
    assert tei.status_code == 422 and _tei_shape(tei.json()), tei.text
    assert "`inputs`" in tei.json()["error"] and "EMBEDDING_MAX_NUM_BATCHED_TOKENS" in tei.text
    vllm = web.post(server.http + "/pooling", json={"input": texts, "task": "token_embed"})
    assert vllm.status_code == 400 and vllm.json()["error"]["param"] == "input", vllm.text
    one = web.post(server.http + "/embed_all", json={"inputs": texts[0]})
    assert one.status_code == 200 and len(one.json()[0]) == 42
    pooled = web.post(server.http + "/embed", json={"inputs": texts})
    assert pooled.status_code == 200 and len(pooled.json()) == 2
