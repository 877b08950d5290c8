"""The embedding and score wire contracts (protocols/embedding.py, openai_embeddings.py, tei.py,
cohere.py, vllm_pooling.py) as the gateway serves them, on the real embedding model: the real
clients (`openai`, `cohere`, `huggingface_hub`) call the gateway's routes, so the bodies they
send are decoded and the answers they parse encoded by the code under test; their own response
types, and vLLM's protocol classes, judge the shapes; the vectors are all-MiniLM-L6-v2's
(unit length, a cat closer to a feline than to stocks, equal texts equal vectors). The
codecs' pure parts are tested without a server at the end."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import cohere
import numpy as np
import openai
import pytest
from cohere import EmbedByTypeResponse
from cohere.v2 import V2RerankResponse
from huggingface_hub import InferenceClient
from openai.types import CreateEmbeddingResponse

from clients import web
from protocols import cohere as cohere_wire
from protocols import openai_embeddings, tei, vllm_pooling
from protocols.embedding import (
    EmbeddingInput,
    EmbeddingRequest,
    Embeddings,
    EmptyInput,
    cosine,
    float32_base64,
    ranked,
)
from protocols.errors import ErrorKind, GenerationError
from serving import RunningServer

VALIDATION = "Validation"
SENTENCES = "inputs.sentences"
IMAGE_PART = "inputs[0].content[0].type"
IMAGE = {"type": "image_url"}
DIRECTION = "$.truncation_direction"
TEXTS = ["The cat sat on the mat.", "A feline rested on a rug.", "Stock markets fell sharply."]
SERVED = "all-MiniLM-L6-v2"
DIM = 384
TOO_LONG = "word " * 300  # past the model's 256 tokens
ATOL = 1e-5  # the same text's vector, alone or in another batch


def unit(v: Any) -> np.ndarray[Any, Any]:
    a = np.array(v, dtype=np.float64)
    return a / np.linalg.norm(a)


@pytest.fixture(scope="module")
def base(embedding_server: RunningServer) -> Iterator[str]:
    yield embedding_server.http


def post(base: str, path: str, body: Any) -> Any:
    return web.post(base + path, json=body)


def reference(base: str, *texts: str) -> list[np.ndarray[Any, Any]]:
    """The model's normalized vectors for `texts`, from OpenAI's route as floats."""
    answer = post(base, "/v1/embeddings", {"input": list(texts), "encoding_format": "float"})
    assert answer.status_code == 200, answer.text
    return [np.array(d["embedding"], dtype=np.float64) for d in answer.json()["data"]]


def token_count(base: str, text: str) -> int:
    """The tokens the model sees for `text`, its special tokens included (TEI's /tokenize)."""
    return len(post(base, "/tokenize", {"inputs": text}).json()[0])


# --- OpenAI: the `openai` SDK ------------------------------------------------------------------


@pytest.fixture(scope="module")
def oai(base: str) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url=base + "/v1", max_retries=0)


def test_the_openai_sdk_reads_base64_vectors_by_default(base: str, oai: openai.OpenAI) -> None:
    """The SDK asks for base64 unless told otherwise, and decodes little-endian float32."""
    answer = oai.embeddings.create(model=SERVED, input=TEXTS)
    assert [d.index for d in answer.data] == [0, 1, 2]
    vectors = [np.array(d.embedding, dtype=np.float64) for d in answer.data]
    for got, want in zip(vectors, reference(base, *TEXTS), strict=True):
        assert got.shape == (DIM,) and np.linalg.norm(got) == pytest.approx(1.0, abs=1e-5)
        assert np.allclose(got, want, atol=ATOL)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]  # a cat: a feline, not stocks
    assert answer.model == SERVED and answer.object == "list"
    assert (
        answer.usage.prompt_tokens
        == answer.usage.total_tokens
        == sum(token_count(base, t) for t in TEXTS)
    )


def test_the_openai_sdk_reads_float_vectors(base: str, oai: openai.OpenAI) -> None:
    answer = oai.embeddings.create(model=SERVED, input=TEXTS[0], encoding_format="float")
    [d] = answer.data
    assert np.allclose(d.embedding, reference(base, TEXTS[0])[0], atol=ATOL)
    raw = post(base, "/v1/embeddings", {"input": TEXTS[0], "encoding_format": "float"}).json()
    CreateEmbeddingResponse.model_validate(raw, strict=True)
    assert raw["model"] == SERVED  # no model asked: the one served


def test_token_ids_are_inputs(base: str, oai: openai.OpenAI) -> None:
    one = oai.embeddings.create(model=SERVED, input=[101, 7592, 102])  # [CLS] hello [SEP]
    assert len(one.data) == 1 and one.usage.prompt_tokens == 3
    assert np.allclose(one.data[0].embedding, reference(base, "hello")[0], atol=ATOL)
    many = oai.embeddings.create(model=SERVED, input=[[101, 102], [101, 7592, 2088, 102]])
    assert [d.index for d in many.data] == [0, 1] and many.usage.prompt_tokens == 6
    assert np.allclose(many.data[1].embedding, reference(base, "hello world")[0], atol=ATOL)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["a", ""]}, "input[1]"),
        ({"input": ["a"] * 2049}, "input"),
        ({"input": ["a", 3]}, "input[1]"),
        ({"input": ["a", [1, 2]]}, "input[1]"),
        ({"input": [[1], [-1]]}, "input[1][0]"),
        ({"input": [[1], []]}, "input[1]"),
        ({"input": 3}, "input"),
        ({"input": {"text": "a"}}, "input"),
        ({}, "input"),
        ({"input": "a", "encoding_format": "bytes"}, "encoding_format"),
        ({"input": "a", "dimensions": 8}, "dimensions"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": TOO_LONG}, "input"),
    ],
)
def test_openai_refusals_name_their_field(
    oai: openai.OpenAI, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        oai.post("/embeddings", body=body, cast_to=CreateEmbeddingResponse)
    assert refused.value.status_code == 400
    assert refused.value.param == param
    assert refused.value.type == "invalid_request_error"


def test_dimensions_and_truncation_where_the_model_takes_them() -> None:
    body = {"input": "a", "dimensions": 8, "truncate_prompt_tokens": 5, "truncation_side": "left"}
    call = openai_embeddings.decode_embeddings(json.dumps(body), dimensions_supported=True)
    assert call.request.dimensions == 8 and call.request.max_tokens == 5
    assert call.request.side == "left" and call.request.truncates
    whole = openai_embeddings.decode_embeddings(
        b'{"input": "a", "truncate_prompt_tokens": -1}', dimensions_supported=False
    )
    assert whole.request.truncate and whole.request.max_tokens is None


def test_base64_is_little_endian_float32() -> None:
    v = [0.1, -2.5, 3.0e-8, 1.0]
    decoded = np.frombuffer(base64.b64decode(float32_base64(v)), dtype="<f4")
    assert decoded.tolist() == np.array(v, dtype=np.float32).tolist()


# --- TEI: huggingface_hub's InferenceClient on a plain base URL, and TEI's routes -------------


def test_feature_extraction_posts_to_the_base_url(base: str) -> None:
    client = InferenceClient(base_url=base)
    one = client.feature_extraction(TEXTS[0])
    assert one.shape == (1, DIM) and one.dtype == np.float32
    assert np.allclose(one[0], reference(base, TEXTS[0])[0], atol=ATOL)
    raw = client.feature_extraction(TEXTS, normalize=False, truncate=True)
    assert raw.shape == (3, DIM)
    assert abs(np.linalg.norm(raw[2]) - 1.0) > 0.01  # not normalized, as asked
    assert np.allclose(unit(raw[2]), reference(base, TEXTS[2])[0], atol=ATOL)


def test_sentence_similarity_posts_to_the_base_url(base: str) -> None:
    client = InferenceClient(base_url=base)
    values = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    source, *others = reference(base, *TEXTS)
    expected = [cosine(list(source), list(v)) for v in others]
    assert values == pytest.approx(expected, abs=ATOL)
    assert values[0] > values[1]  # a cat: a feline, not stocks


def test_tei_routes_answer_teis_shapes(base: str) -> None:
    embedded = post(base, "/embed", {"inputs": TEXTS[0]})
    assert embedded.status_code == 200 and len(embedded.json()) == 1
    assert len(embedded.json()[0]) == DIM
    mixed = post(base, "/embed", {"inputs": [TEXTS[0], [101, 102]]}).json()
    assert len(mixed) == 2
    tokens = post(base, "/embed_all", {"inputs": ["a b", "c"]}).json()
    assert [len(t) for t in tokens] == [4, 3] and len(tokens[0][0]) == DIM
    body = {"query": TEXTS[0], "texts": [*TEXTS[1:], TEXTS[0]], "return_text": True}
    ranks = post(base, "/rerank", body).json()
    assert [r["score"] for r in ranks] == sorted((r["score"] for r in ranks), reverse=True)
    assert ranks[0] == {"index": 2, "text": TEXTS[0], "score": pytest.approx(1.0)}
    bare = post(base, "/rerank", {"query": "q", "texts": ["a", "b"]}).json()
    assert all(set(r) == {"index", "score"} for r in bare)
    split = post(base, "/tokenize", {"inputs": "hello big world"}).json()
    words = [
        {"id": 7592, "text": "hello", "special": False, "start": 0, "stop": 5},
        {"id": 2502, "text": "big", "special": False, "start": 6, "stop": 9},
        {"id": 2088, "text": "world", "special": False, "start": 10, "stop": 15},
    ]
    cls = {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    sep = {"id": 102, "text": "[SEP]", "special": True, "start": None, "stop": None}
    assert split == [[cls, *words, sep]]
    bare_words = {"inputs": "hello big world", "add_special_tokens": False}
    assert post(base, "/tokenize", bare_words).json() == [words]


def test_tei_info_has_teis_fields(base: str) -> None:
    info = web.get(base + "/info", params={"model": SERVED}).json()
    required = {
        "model_id", "model_dtype", "served_model_name", "model_type", "max_concurrent_requests",
        "max_input_length", "max_batch_tokens", "max_client_batch_size", "auto_truncate",
        "tokenization_workers", "version",
    }  # fmt: skip
    assert required <= set(info)  # TEI's docs/openapi.json, Info's `required`
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}


def similarity(sentences: list[str]) -> dict[str, Any]:
    return {"inputs": {"source_sentence": "a", "sentences": sentences}}


@pytest.mark.parametrize(
    ("path", "body", "status", "error_type", "field"),
    [
        ("/embed", {"inputs": []}, 400, "Empty", "inputs"),
        ("/embed", {"inputs": ""}, 400, "Empty", "inputs"),
        ("/embed", {"inputs": ["a"] * 33}, 422, "Validation", "inputs"),
        ("/embed", {"inputs": ["a", 3]}, 422, "Validation", "inputs[1]"),
        ("/embed", {"inputs": "a", "truncation_direction": "up"}, 422, VALIDATION, DIRECTION),
        ("/embed", {"inputs": "a", "dimensions": 4}, 422, "Validation", "dimensions"),
        ("/embed", {"inputs": TOO_LONG}, 422, "Validation", "inputs"),
        ("/embed", {}, 422, "Validation", "$"),  # at the object lacking `inputs`: named below
        ("/rerank", {"query": "q", "texts": []}, 400, "Empty", "texts"),
        ("/rerank", {"query": 1, "texts": ["a"]}, 422, "Validation", "query"),
        ("/similarity", similarity([]), 400, "Empty", SENTENCES),
        ("/similarity", similarity(["b"] * 32), 422, VALIDATION, SENTENCES),
        ("/tokenize", {"inputs": []}, 400, "Empty", "inputs"),
        ("/invocations", {"text": "a"}, 422, "Validation", "inputs"),
    ],
)  # fmt: skip
def test_tei_refusals_in_teis_shape(
    base: str, path: str, body: Any, status: int, error_type: str, field: str
) -> None:
    answer = post(base, path, body)
    assert answer.status_code == status
    error = answer.json()
    assert set(error) == {"error", "error_type"} and error["error_type"] == error_type
    assert f"`{field}`" in error["error"]


def test_invocations_pick_the_task_from_the_body(base: str) -> None:
    embedded = post(base, "/invocations", {"inputs": ["a", "b"], "normalize": False}).json()
    assert abs(np.linalg.norm(embedded[1]) - 1.0) > 0.01  # not normalized, as asked
    assert np.allclose(unit(embedded[1]), reference(base, "b")[0], atol=ATOL)
    ranks = post(base, "/invocations", {"query": "a", "texts": ["b", "a"]}).json()
    assert ranks[0]["index"] == 1
    similar = {"inputs": {"source_sentence": "a", "sentences": ["a", "b"]}}
    assert post(base, "/invocations", similar).json()[0] == pytest.approx(1.0)


def test_tei_decoding_keeps_teis_defaults() -> None:
    body = {"inputs": "a", "truncate": True, "truncation_direction": "left", "prompt_name": "q"}
    request = tei.decode_embed(json.dumps(body), dimensions_supported=False)
    assert request.normalize is True and request.truncate and request.side == "left"
    assert request.prompt_name == "q"
    # huggingface_hub's feature_extraction puts its parameters at the root, some TEI ignores
    hub = {"inputs": ["a"], "encoding_format": "float", "truncation_direction": "Right"}
    assert tei.decode_embed(json.dumps(hub), dimensions_supported=False).side == "right"
    auto = tei.decode_embed(b'{"inputs": "a"}', dimensions_supported=False, auto_truncate=True)
    assert auto.truncate
    assert tei.decode_embed_all(b'{"inputs": "a"}').token_level


def test_a_tei_body_without_inputs_is_refused_naming_the_key() -> None:
    with pytest.raises(GenerationError) as caught:
        tei.decode_embed(b"{}", dimensions_supported=False)
    assert caught.value.field == "$.inputs" and "inputs" in caught.value.message
    assert tei.error_of(caught.value)[0] == 422


# --- Cohere: the `cohere` SDK ------------------------------------------------------------------


@pytest.fixture(scope="module")
def co(base: str) -> cohere.ClientV2:
    return cohere.ClientV2(api_key="k", base_url=base, max_retries=0)


def test_the_cohere_sdk_embeds_in_every_type(base: str, co: cohere.ClientV2) -> None:
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    answer = co.embed(
        model=SERVED, input_type="search_document", texts=TEXTS, embedding_types=types
    )
    e = answer.embeddings
    assert e.float_ is not None and e.int8 is not None and e.uint8 is not None
    assert e.binary is not None and e.ubinary is not None and e.base64 is not None
    for i, want in enumerate(reference(base, *TEXTS)):
        assert np.allclose(e.float_[i], want, atol=ATOL)
        v = np.array(e.float_[i])
        assert np.frombuffer(base64.b64decode(e.base64[i]), "<f4") == pytest.approx(v)
        assert e.int8[i] == [round(x * 127) for x in v]
        assert all(0 <= x <= 255 for x in e.uint8[i]) and len(e.uint8[i]) == DIM
        assert e.ubinary[i] == np.packbits(v > 0).tolist()
        assert e.binary[i] == [b - 128 for b in e.ubinary[i]]
    assert answer.texts == TEXTS
    assert answer.meta is not None and answer.meta.billed_units is not None
    raw = post(base, "/v2/embed", {"model": SERVED, "texts": ["a"]}).json()
    EmbedByTypeResponse.model_validate(raw, strict=True)
    assert set(raw["embeddings"]) == {"float"}  # no embedding_types: float


def test_cohere_inputs_of_text_content(base: str, co: cohere.ClientV2) -> None:
    parts: list[cohere.EmbedContent] = [
        cohere.TextEmbedContent(text="a"),
        cohere.TextEmbedContent(text="b"),
    ]
    answer = co.embed(
        model=SERVED, input_type="search_query", inputs=[cohere.EmbedInput(content=parts)]
    )
    [vector] = answer.embeddings.float_ or []
    assert np.allclose(vector, reference(base, "a\nb")[0], atol=ATOL)


def test_the_cohere_sdk_reranks(base: str, co: cohere.ClientV2) -> None:
    documents = [TEXTS[1], TEXTS[2], TEXTS[0]]
    answer = co.rerank(model=SERVED, query=TEXTS[0], documents=documents, top_n=2)
    assert answer.results[0].index == 2 and len(answer.results) == 2
    scores = [r.relevance_score for r in answer.results]
    assert scores == sorted(scores, reverse=True)
    body = {"model": SERVED, "query": "q", "documents": ["a", "b"]}
    raw = post(base, "/v2/rerank", body).json()
    V2RerankResponse.model_validate(raw, strict=True)
    assert len(raw["results"]) == 2  # no top_n: every document


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v2/embed", {"model": SERVED, "texts": []}, "texts"),
        ("/v2/embed", {"model": SERVED, "texts": ["a"] * 97}, "texts"),
        ("/v2/embed", {"model": SERVED, "texts": ["a", ""]}, "texts[1]"),
        ("/v2/embed", {"model": SERVED, "images": ["data:image/png;base64,AA=="]}, "images"),
        ("/v2/embed", {"model": SERVED}, "texts"),
        ("/v2/embed", {"model": SERVED, "texts": ["a"], "output_dimension": 8}, "output_dimension"),
        ("/v2/embed", {"texts": ["a"], "embedding_types": ["i4"]}, "$.embedding_types[0]"),
        ("/v2/embed", {"model": SERVED, "texts": ["a"], "truncate": "MIDDLE"}, "$.truncate"),
        ("/v2/embed", {"model": SERVED, "texts": [TOO_LONG], "truncate": "NONE"}, "texts[0]"),
        ("/v2/embed", {"model": SERVED, "inputs": [{"content": [IMAGE]}]}, IMAGE_PART),
        ("/v2/rerank", {"model": SERVED, "query": "q", "documents": []}, "documents"),
        ("/v2/rerank", {"model": SERVED, "query": "", "documents": ["a"]}, "query"),
        ("/v2/rerank", {"model": SERVED, "query": "q", "documents": ["a"], "top_n": -1}, "$.top_n"),
    ],
)  # fmt: skip
def test_cohere_refusals_in_coheres_shape(
    base: str, path: str, body: dict[str, Any], field: str
) -> None:
    answer = post(base, path, body)
    assert answer.status_code == 400
    error = answer.json()
    assert set(error) == {"id", "message"} and f"`{field}`" in error["message"]


def test_the_cohere_sdk_raises_its_error_on_a_refusal(co: cohere.ClientV2) -> None:
    with pytest.raises(cohere.BadRequestError) as refused:
        co.embed(model=SERVED, input_type="search_document", texts=[])
    assert "`texts`" in refused.value.body["message"]
    with pytest.raises(cohere.BadRequestError):
        co.rerank(model=SERVED, query="q", documents=[])


def test_long_texts_are_cut_where_cohere_is_asked_to(base: str) -> None:
    for truncate in ("START", "END"):
        body = {"model": SERVED, "texts": [TOO_LONG], "truncate": truncate}
        assert post(base, "/v2/embed", body).status_code == 200
    request = cohere_wire.decode_embed(
        b'{"texts": ["a"], "truncate": "START", "max_tokens": 9}', dimensions_supported=False
    ).request
    assert request.side == "left" and request.max_tokens == 9 and request.truncate


# --- vLLM's pooling, score and rerank routes, judged by vLLM's own protocol classes ----------


@pytest.fixture(scope="module")
def vllm_protocol() -> Any:
    return pytest.importorskip("vllm.entrypoints.pooling.scoring.protocol")


def test_pooling_answers_vllms_shape(base: str) -> None:
    pooling = pytest.importorskip("vllm.entrypoints.pooling.pooling.protocol")
    pooled = post(base, "/pooling", {"input": TEXTS[:2]}).json()
    pooling.PoolingResponse.model_validate(pooled)
    assert np.allclose(pooled["data"][1]["data"], reference(base, TEXTS[1])[0], atol=ATOL)
    tokens = post(base, "/pooling", {"input": "a b", "task": "token_embed"}).json()
    pooling.PoolingResponse.model_validate(tokens)
    assert len(tokens["data"][0]["data"]) == 4  # [CLS] a b [SEP]
    assert len(tokens["data"][0]["data"][0]) == DIM
    packed = post(base, "/pooling", {"input": "a", "encoding_format": "base64"}).json()
    flat = np.frombuffer(base64.b64decode(packed["data"][0]["data"]), "<f4")
    assert np.allclose(flat, reference(base, "a")[0], atol=ATOL)


def test_score_and_rerank_answer_vllms_shapes(base: str, vllm_protocol: Any) -> None:
    for path in ("/score", "/v1/score"):
        scored = post(base, path, {"text_1": "a", "text_2": ["a", "b"]}).json()
        vllm_protocol.ScoreResponse.model_validate(scored)
        assert [d["index"] for d in scored["data"]] == [0, 1]
        assert scored["data"][0]["score"] == pytest.approx(1.0)
    pairs = post(base, "/score", {"queries": ["a", "b"], "documents": ["b", "b"]}).json()
    assert pairs["data"][1]["score"] == pytest.approx(1.0)
    body = {"model": SERVED, "query": "a", "documents": ["b", "a", "c"], "top_n": 2}
    vllm_protocol.RerankRequest.model_validate(body)  # the same body vLLM takes
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        ranks = post(base, path, body).json()
        vllm_protocol.RerankResponse.model_validate(ranks)
        assert ranks["results"][0]["index"] == 1 and len(ranks["results"]) == 2
        assert ranks["results"][0]["document"] == {"text": "a"}
    V2RerankResponse.model_validate(post(base, "/v2/rerank", body).json(), strict=True)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/pooling", {"input": "a", "task": "classify"}, "task"),
        ("/pooling", {"input": "a", "normalize": True}, "normalize"),
        ("/pooling", {"messages": [{"role": "user", "content": "a"}]}, "messages"),
        ("/pooling", {"input": []}, "input"),
        ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
        ("/score", {"text_1": "a"}, "text_2"),
        ("/score", {"text_1": "a", "text_2": [{"content": []}]}, "text_2[0]"),
        ("/rerank", {"query": "a", "documents": []}, "documents"),
        ("/v1/rerank", {"query": "a", "documents": ["b"], "top_n": -1}, "top_n"),
    ],
)
def test_vllm_refusals_in_openais_shape(base: str, path: str, body: Any, param: str) -> None:
    answer = post(base, path, body)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param


# --- The neutral vocabulary --------------------------------------------------------------------


def test_ranked_is_best_first_ties_in_order() -> None:
    assert [r.index for r in ranked([0.5, 0.9, 0.5, 0.1], None)] == [1, 0, 2, 3]
    assert [r.index for r in ranked([0.5, 0.9, 0.5, 0.1], 2)] == [1, 0]


def test_every_family_answers_an_empty_input_in_its_shape() -> None:
    empty = EmptyInput("`input` cannot be empty", "input")
    assert tei.error_of(empty)[0] == 400
    assert cohere_wire.error_of(empty)[0] == 400
    assert json.loads(tei.error_of(empty)[1])["error_type"] == "Empty"
    too_long = GenerationError(ErrorKind.CONTEXT_LENGTH_EXCEEDED, "too long", "input[0]")
    assert tei.error_of(too_long)[0] == 422
    for kind, status in [(ErrorKind.ENGINE_ERROR, 424), (ErrorKind.RATE_LIMITED, 429)]:
        assert tei.error_of(GenerationError(kind, "x"))[0] == status


def test_similarities_are_cosines_of_the_source() -> None:
    result = Embeddings([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]], 6)
    assert tei.similarities(result) == [0.0, 1.0]


def test_requests_keep_each_inputs_field() -> None:
    request = EmbeddingRequest(inputs=(EmbeddingInput("input[0]", text="a"),))
    assert request.inputs[0].field == "input[0]" and not request.truncates
    call = vllm_pooling.decode_pooling(b'{"input": [[1, 2], [3]]}', dimensions_supported=False)
    assert [i.field for i in call.request.inputs] == ["input[0]", "input[1]"]
    assert call.request.inputs[1].token_ids == (3,)


def test_dimensions_where_the_caller_says_the_model_takes_them() -> None:
    """Each family's field for shortened vectors, accepted with the flag and named without."""
    decoders: list[tuple[str, Any]] = [
        ('{"input": "a", "dimensions": 8}', openai_embeddings.decode_embeddings),
        ('{"inputs": "a", "dimensions": 8}', tei.decode_embed),
        ('{"texts": ["a"], "output_dimension": 8}', cohere_wire.decode_embed),
        ('{"input": "a", "dimensions": 8}', vllm_pooling.decode_pooling),
    ]
    for body, decode in decoders:
        decoded = decode(body, dimensions_supported=True)
        request = decoded if isinstance(decoded, EmbeddingRequest) else decoded.request
        assert request.dimensions == 8
        with pytest.raises(GenerationError) as refused:
            decode(body, dimensions_supported=False)
        assert refused.value.field == request.dimensions_field
