"""The official `anthropic` client, changed only in its base URL, against
skillhost and the real model: text, streaming, a tool_use round trip, and
bad input in Anthropic's error shape. The SDK's own types validate every
response and event."""

import anthropic
import httpx
import pytest

WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
# This SDK no longer takes sampling parameters; the API still does.
MODEL = "SmolLM2-135M-Instruct.Q4_1"
GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(server):
    # Any model name is accepted (the stream test sends a Claude one): the
    # one loaded model answers them all.
    return anthropic.Anthropic(base_url=server.url, api_key="unused")


def test_a_message_comes_back_as_content_blocks(client):
    message = client.messages.create(
        model=MODEL, max_tokens=32, system="You are a helpful assistant.", messages=QUESTION,
        extra_body=GREEDY,
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens > 0
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 10


def test_a_stream_adds_up_to_the_same_message(client):
    # The same request first, so that each compared request finds the
    # prompt's cells exactly as the one before it left them. Otherwise the
    # first would prefill the whole prompt in one batch and the second reuse
    # it and decode only its last token, whose logits can differ in the last
    # bits, enough to flip a greedy choice: the two would match only where an
    # earlier test happened to have cached this prompt.
    client.messages.create(model="claude-haiku-4-5", max_tokens=24, messages=QUESTION, extra_body=GREEDY)
    with client.messages.stream(model="claude-haiku-4-5", max_tokens=24, messages=QUESTION, extra_body=GREEDY) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start"
    assert "content_block_start" in events and "content_block_stop" in events
    assert events[-1] == "message_stop"
    whole = client.messages.create(model="claude-haiku-4-5", max_tokens=24, messages=QUESTION, extra_body=GREEDY)
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason


def test_a_tool_use_round_trip(client):
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(
        model=MODEL, max_tokens=64, messages=asked, tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY,
    )
    assert first.stop_reason == "tool_use"
    use = next(block for block in first.content if block.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input, dict)
    # The same call, streamed: the arguments arrive as input_json_delta.
    with client.messages.stream(
        model=MODEL, max_tokens=64, messages=asked, tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY,
    ) as stream:
        streamed = stream.get_final_message()
    assert [b.type for b in streamed.content if b.type == "tool_use"] == ["tool_use"]
    assert streamed.content[-1].input == use.input
    followup = client.messages.create(
        model=MODEL, max_tokens=32, tools=[WEATHER], extra_body=GREEDY,
        messages=[
            *asked,
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 degrees."},
            ]},
        ],
    )
    assert followup.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert followup.content


@pytest.mark.parametrize(
    "change, message",
    [
        ({"max_tokens": None}, "'max_tokens' is required"),
        ({"messages": []}, "'messages' must contain at least one message"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "must be \"user\", \"assistant\" or \"system\""),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
         "'messages[0].content[0].source.type' is missing; this server takes base64, text (documents) and file sources"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]},
         "this server fetches nothing from the network"),
        ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "needs a 'type'"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool 'web_search_20250305'"),
        ({"tool_choice": {"type": "tool"}}, "needs a 'name'"),
        ({"tool_choice": {"type": "sometimes"}}, "'tool_choice.type' must be"),
        ({"temperature": "hot"}, "'temperature' is invalid"),
        ({"messages": "hi"}, "'messages' is invalid"),
        ({"system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "persistent"}}]},
         "'system[0].cache_control' must be {\"type\": \"ephemeral\"}"),
        ({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "10m"}}]}]},
         "'messages[0].content[0].cache_control.ttl' must be \"5m\" or \"1h\""),
        # One past Anthropic's limit of four breakpoints.
        ({"system": [{"type": "text", "text": f"Rule {n}.", "cache_control": {"type": "ephemeral"}}
                     for n in range(5)]},
         "at most 4 cache_control breakpoints; 'system[4].cache_control' is one more"),
    ],
)
def test_bad_input_is_a_4xx_in_anthropic_shape(server, change, message):
    body = {"model": MODEL, "max_tokens": 8, "messages": QUESTION, **change}
    body = {k: v for k, v in body.items() if v is not None}
    response = httpx.post(server.url + "/v1/messages", json=body)
    assert 400 <= response.status_code < 500, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    assert message in error["error"]["message"], error


def test_count_tokens_matches_what_a_message_reports(client):
    counted = client.messages.count_tokens(model=MODEL, system="You are a helpful assistant.", messages=QUESTION)
    message = client.messages.create(
        model=MODEL, max_tokens=4, system="You are a helpful assistant.", messages=QUESTION, extra_body=GREEDY,
    )
    usage = message.usage
    used = usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    assert counted.input_tokens == used
    with_tools = client.messages.count_tokens(model=MODEL, messages=QUESTION, tools=[WEATHER])
    alone = client.messages.count_tokens(model=MODEL, messages=QUESTION)
    assert with_tools.input_tokens > alone.input_tokens > 0


def test_cache_breakpoints_split_the_fresh_tokens_into_written_and_input(client):
    mark = {"type": "ephemeral"}
    # Longer than the least prefix the engine shares between requests (64
    # tokens), so the second request reuses it whichever slot it runs on.
    rules = " ".join(f"Rule {n}: answer in one word, and never add a second sentence." for n in range(1, 9))
    system = [{"type": "text", "text": "You are a helpful assistant. " + rules, "cache_control": mark}]

    def ask(question, marks_question, ttl=None):
        block = {"type": "text", "text": question}
        if marks_question:
            block["cache_control"] = {**mark, **({"ttl": ttl} if ttl else {})}
        messages = [{"role": "user", "content": [block]}]
        usage = client.messages.create(model=MODEL, max_tokens=4, system=system, messages=messages,
                                       extra_body=GREEDY).usage
        counted = client.messages.count_tokens(model=MODEL, system=system, messages=messages).input_tokens
        # The three parts add up to the whole prompt.
        assert usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens == counted
        return usage

    # Marked through the last message, as Claude Code marks: every fresh
    # token was written to the cache, none is plain input.
    whole = ask("What is the capital of Italy?", True, ttl="1h")
    assert whole.input_tokens == 0 and whole.cache_creation_input_tokens > 0, whole
    # Marked on the system prompt only: what follows it is input, and the
    # system prompt itself comes from the cache now.
    split = ask("Which river flows through Rome?", False)
    assert split.input_tokens > 0 and split.cache_read_input_tokens > 0, split
    # Four breakpoints, Anthropic's limit, are taken.
    four = [{"type": "text", "text": f"Rule {n}.", "cache_control": mark} for n in range(4)]
    message = client.messages.create(model=MODEL, max_tokens=2, system=four, messages=QUESTION, extra_body=GREEDY)
    # Its system prompt is new here, and marked: written to the cache.
    assert message.usage.cache_creation_input_tokens > 0, message.usage


def test_the_sdk_raises_its_own_error_types(client):
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=MODEL, max_tokens=8, messages=[])
    assert refused.value.status_code == 400
    models = client.models.list()
    assert models.data[0].id == "SmolLM2-135M-Instruct.Q4_1"


# Every field of the request, each with a value of the wrong type.
WRONG_TYPES = {
    "model": 5, "max_tokens": "x", "messages": 5, "system": 5, "tools": 5, "tool_choice": 5, "stop_sequences": 5,
    "temperature": "x", "top_p": "x", "top_k": "x", "stream": "x", "thinking": 5, "metadata": 5, "skills": 5,
    "skills_discovery": "x",
}


@pytest.mark.parametrize("field", sorted(WRONG_TYPES))
def test_each_field_of_the_wrong_type_is_a_400_naming_it(server, field):
    body = {"model": MODEL, "max_tokens": 4, "messages": QUESTION, field: WRONG_TYPES[field]}
    response = httpx.post(server.url + "/v1/messages", json=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    assert f"'{field}'" in error["error"]["message"] and "enum" not in error["error"]["message"], error
