"""Embeddings side by side with llama-server: the default model loaded for
embeddings (`embedding: true`, mean and last pooling) in skillhost and in
llama.cpp's own server (`--embedding --pooling`, attention unfused on both), asked for the same inputs
through the `openai` and `ollama` clients. The vectors must agree within
1e-4 cosine distance, whether skillhost batches the inputs of one request
or of many at once."""

import json
import math
import threading
import urllib.error
import urllib.request

import pytest

from conftest import DEFAULT_MODEL, RunningServer
from test_upstreams import LlamaServer

# Host-independent text: nothing here depends on the model's choices.
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A skill is a folder with a SKILL.md file.",
    "hello",
    "Embeddings map text to vectors; similar texts get nearby vectors.",
    "1 2 3 4 5 6 7 8 9 10",
]
MAX_COSINE_DISTANCE = 1e-4


def entry(name, **settings):
    return json.dumps({"name": name, "path": str(DEFAULT_MODEL), **settings})


@pytest.fixture(scope="module")
def references():
    # Unfused attention on both sides, skillhost's default for embeddings
    # (see `embed::context_params`): llama-server's default fused kernel
    # gives vectors 5e-4 cosine distance away from the unfused ones.
    started = {pooling: LlamaServer("--embedding", "--pooling", pooling, "-fa", "off") for pooling in ("mean", "last")}
    yield started
    for server in started.values():
        server.stop()


@pytest.fixture(scope="module")
def served():
    server = RunningServer([
        "--model", f"chat={DEFAULT_MODEL}",
        "--model-entry", entry("embed-mean", embedding=True, pooling="mean", aliases=["embedder"]),
        "--model-entry", entry("embed-last", embedding=True, pooling="last"),
        "--model-entry", entry("embed-short", embedding=True, pooling="mean", **{"ctx-size": 256}),
    ])
    yield server
    server.stop()


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def reference_vectors(server, texts):
    """llama-server's vector of each text, one text per request: the
    llama-server built here returns vectors that move with the other
    inputs of a request (up to 0.06 cosine distance from the same text
    alone), while skillhost's do not move (its batches of several inputs
    equal its single inputs exactly)."""
    vectors = []
    for text in texts:
        status, body = post(server.url + "/v1/embeddings", {"input": text, "encoding_format": "float"})
        assert status == 200, body
        vectors.append(body["data"][0]["embedding"])
    return vectors


def cosine_distance(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return 1.0 - dot / norms


def assert_close(got, expected):
    assert len(got) == len(expected)
    for index, (a, b) in enumerate(zip(got, expected)):
        assert len(a) == len(b), f"input {index}: {len(a)} dimensions, llama-server gave {len(b)}"
        distance = cosine_distance(a, b)
        assert distance < MAX_COSINE_DISTANCE, f"input {index}: cosine distance {distance} from llama-server"


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_the_openai_client_gets_llama_servers_vectors(served, references, pooling):
    from openai import OpenAI

    client = OpenAI(base_url=served.url + "/v1", api_key="unused")
    # The client asks for base64 unless told otherwise, and decodes it.
    result = client.embeddings.create(model=f"embed-{pooling}", input=TEXTS)
    assert result.model == f"embed-{pooling}"
    assert [item.index for item in result.data] == list(range(len(TEXTS)))
    assert result.usage.prompt_tokens > len(TEXTS)
    got = [item.embedding for item in result.data]
    assert_close(got, reference_vectors(references[pooling], TEXTS))
    # Unit length, as llama-server returns them.
    assert all(abs(math.sqrt(sum(x * x for x in vector)) - 1.0) < 1e-4 for vector in got)
    floats = client.embeddings.create(model=f"embed-{pooling}", input=TEXTS[0], encoding_format="float")
    assert_close([floats.data[0].embedding], [got[0]])


def test_inputs_of_concurrent_requests_share_batches_and_keep_their_vectors(served, references):
    expected = reference_vectors(references["mean"], TEXTS)
    got = [None] * len(TEXTS)

    def one(index):
        status, body = post(served.url + "/v1/embeddings", {"model": "embedder", "input": TEXTS[index], "encoding_format": "float"})
        assert status == 200, body
        got[index] = body["data"][0]["embedding"]

    threads = [threading.Thread(target=one, args=(index,)) for index in range(len(TEXTS)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert_close(got, expected)


def test_token_id_inputs_embed_like_their_text(served, references):
    status, tokenized = post(references["mean"].url + "/tokenize", {"content": TEXTS[0], "add_special": True})
    assert status == 200, tokenized
    status, body = post(
        served.url + "/v1/embeddings",
        {"model": "embed-mean", "input": [tokenized["tokens"], TEXTS[0]], "encoding_format": "float"},
    )
    assert status == 200, body
    vectors = [item["embedding"] for item in body["data"]]
    assert_close(vectors, reference_vectors(references["mean"], [TEXTS[0], TEXTS[0]]))


def test_the_ollama_client_embeds_and_cuts_a_long_input_unless_told_not_to(served, references):
    import ollama

    client = ollama.Client(host=served.url + "/ollama")
    result = client.embed(model="embed-mean:latest", input=TEXTS)
    assert result.model == "embed-mean"
    assert result.prompt_eval_count > len(TEXTS)
    assert_close(result.embeddings, reference_vectors(references["mean"], TEXTS))

    long_text = " ".join(["word"] * 600)
    cut = client.embed(model="embed-short", input=long_text)
    assert len(cut.embeddings) == 1 and cut.prompt_eval_count == 256
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="embed-short", input=long_text, truncate=False)
    assert refused.value.status_code == 400
    assert "embeds at most 256 tokens per input" in refused.value.error


def test_the_wrong_kind_of_model_and_bad_inputs_are_400s_that_say_why(served):
    url = served.url + "/v1/embeddings"
    status, body = post(url, {"model": "chat", "input": "hi"})
    assert status == 400 and "loaded for chat, not embeddings" in body["error"]["message"]
    status, body = post(served.url + "/v1/chat/completions", {"model": "embed-mean", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and "loaded for embeddings only" in body["error"]["message"]
    status, body = post(url, {"model": "embed-mean", "input": "hi", "dimensions": 8})
    assert status == 400 and "cannot shorten them" in body["error"]["message"]
    status, body = post(url, {"model": "embed-mean", "input": [[1, 10**9]]})
    assert status == 400 and "not in the model's vocabulary" in body["error"]["message"]
    status, body = post(url, {"model": "embed-short", "input": " ".join(["word"] * 600)})
    assert status == 400 and "embeds at most 256 tokens per input" in body["error"]["message"]
    # The per-input context, at the limit and one past it (token ids, so
    # the count is exact).
    status, body = post(url, {"model": "embed-short", "input": [[1] * 256], "encoding_format": "float"})
    assert status == 200 and body["usage"]["prompt_tokens"] == 256, body
    status, body = post(url, {"model": "embed-short", "input": [[1] * 257]})
    assert status == 400 and "an input is 257 tokens long" in body["error"]["message"], body
    # One input past the most a request takes (the unit test in
    # src/http/embeddings.rs takes exactly the most).
    status, body = post(url, {"model": "embed-short", "input": [[1]] * 2049})
    assert status == 400 and "one request takes at most 2048" in body["error"]["message"]
    status, body = post(url, {"model": "nope", "input": "hi"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, body = post(url, {"model": "embed-mean", "input": {"text": "hi"}})
    assert status == 400 and body["error"]["param"] == "input"
    # The server is still whole.
    status, body = post(url, {"model": "embed-mean", "input": "still here"})
    assert status == 200


def test_models_list_and_ollama_show_say_which_models_embed(served):
    with urllib.request.urlopen(served.url + "/v1/models") as response:
        listed = {model["id"] for model in json.loads(response.read())["data"]}
    assert {"chat", "embed-mean", "embed-last", "embed-short"} <= listed
    status, shown = post(served.url + "/ollama/api/show", {"model": "embed-mean"})
    assert status == 200 and shown["capabilities"] == ["embedding"]
