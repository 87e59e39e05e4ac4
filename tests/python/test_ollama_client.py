"""The official `ollama` client, changed only in its host, against skillhost
and the real model."""

import json

import httpx
import ollama
import pytest

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
FRANCE = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
OPTIONS = {"temperature": 0, "num_predict": 48}


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url + "/ollama")


class RequireToolCall(httpx.HTTPTransport):
    """Adds skillhost's `tool_choice` extension to each request: the 135M
    test model never calls a tool on its own, and Ollama's API cannot ask."""

    def handle_request(self, request):
        body = json.loads(request.content)
        body["tool_choice"] = "required"
        headers = [(k, v) for k, v in request.headers.items() if k.lower() != "content-length"]
        return super().handle_request(httpx.Request(request.method, request.url, headers=headers, json=body))


@pytest.fixture(scope="module")
def model(client):
    return client.list().models[0].model


def test_list_show_and_version(client, model):
    assert model.endswith(":latest")
    shown = client.show(model)
    assert "completion" in shown.capabilities
    assert shown.details.format == "gguf"
    with pytest.raises(ollama.ResponseError) as error:
        client.show("llama3:latest")
    assert error.value.status_code == 404


def test_chat_answers_in_ollamas_shape(client, model):
    # The shape and the counts, not the words: on the shared server another
    # test may have cached this prompt, and a prompt reused from the cache
    # can flip a greedy choice of the 135M model (the chat CLI's test, on a
    # fresh server, checks the answer itself).
    reply = client.chat(model=model, messages=FRANCE, options=OPTIONS, stream=False)
    assert reply.message.role == "assistant" and reply.message.content.strip()
    assert reply.done and reply.done_reason in ("stop", "length")
    assert reply.prompt_eval_count > 0 and reply.eval_count > 0
    assert reply.total_duration >= reply.eval_duration > 0


def test_streaming_matches_the_non_streamed_answer(client, model):
    # The same request first, so that each compared request finds the
    # prompt's cells exactly as the one before it left them. Otherwise the
    # first would prefill the whole prompt in one batch and the second reuse
    # it and decode only its last token, whose logits can differ in the last
    # bits, enough to flip a greedy choice: the two would match only where an
    # earlier test happened to have cached this prompt.
    client.chat(model=model, messages=FRANCE, options=OPTIONS, stream=False)
    whole = client.chat(model=model, messages=FRANCE, options=OPTIONS, stream=False)
    parts = list(client.chat(model=model, messages=FRANCE, options=OPTIONS, stream=True))
    assert len(parts) > 2, "the answer came in one piece"
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert parts[-1].eval_count == whole.eval_count


def test_a_tool_call_and_its_result(server, client, model):
    calling = ollama.Client(host=server.url + "/ollama", transport=RequireToolCall())
    messages = [SYSTEM, {"role": "user", "content": "What is the weather in Paris?"}]
    reply = calling.chat(model=model, messages=messages, tools=[WEATHER], options=OPTIONS, stream=False)
    calls = reply.message.tool_calls
    assert calls, f"no tool call: {reply.message.content!r}"
    assert calls[0].function.name == "get_weather"
    assert isinstance(calls[0].function.arguments, dict)
    assert isinstance(calls[0].function.arguments.get("city"), str)
    # The call and its result go back in Ollama's shapes; the model answers.
    messages += [reply.message, {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 21 C."}]
    answer = client.chat(model=model, messages=messages, tools=[WEATHER], options=OPTIONS, stream=False)
    assert answer.done
    assert answer.message.content or answer.message.tool_calls


def test_json_format_and_errors(client, model):
    reply = client.chat(
        model=model,
        messages=[SYSTEM, {"role": "user", "content": "Give the capital of France as JSON."}],
        format="json",
        options=OPTIONS,
        stream=False,
    )
    # Held to JSON from the first token; whole once the model ends it (the
    # budget may cut a long one, which the model decides).
    assert reply.message.content.lstrip().startswith("{")
    if reply.done_reason == "stop":
        json.loads(reply.message.content)
    with pytest.raises(ollama.ResponseError) as error:
        client.chat(model="llama3:latest", messages=FRANCE, stream=False)
    assert error.value.status_code == 404
