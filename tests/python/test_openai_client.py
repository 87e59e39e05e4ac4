"""The official `openai` client, unchanged, against skillhost and the real model."""

import json

import jsonschema

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
FRANCE = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Current weather in a city.", "parameters": WEATHER_SCHEMA},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a time zone.",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
        },
    },
]


def model_id(client):
    return client.models.list().data[0].id


def test_chat_answers_in_openais_shape(client):
    # The shape and the counts, not the words: on the shared server another
    # test may have cached this prompt, and a prompt reused from the cache
    # can flip a greedy choice of the 135M model (the chat CLI's test, on a
    # fresh server, checks the answer itself).
    response = client.chat.completions.create(model=model_id(client), messages=FRANCE, temperature=0, max_tokens=48)
    assert response.choices[0].message.content.strip()
    assert response.choices[0].finish_reason in ("stop", "length")
    assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens > 0


def test_streaming_matches_the_non_streamed_answer(client):
    # The same request first, so that each compared request finds the
    # prompt's cells exactly as the one before it left them. Otherwise the
    # first would prefill the whole prompt in one batch and the second reuse
    # it and decode only its last token, whose logits can differ in the last
    # bits, enough to flip a greedy choice: the two would match only where an
    # earlier test happened to have cached this prompt.
    client.chat.completions.create(model=model_id(client), messages=FRANCE, temperature=0, max_tokens=48)
    whole = client.chat.completions.create(model=model_id(client), messages=FRANCE, temperature=0, max_tokens=48)
    stream = client.chat.completions.create(
        model=model_id(client),
        messages=FRANCE,
        temperature=0,
        max_tokens=48,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text == whole.choices[0].message.content
    # Whether 48 tokens end the answer is the model's; that both forms end
    # alike is the server's.
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_required_tool_call_parses_and_validates(client):
    response = client.chat.completions.create(
        model=model_id(client),
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.id and call.type == "function"
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_named_tool_choice_calls_that_tool(client):
    response = client.chat.completions.create(
        model=model_id(client),
        messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
    )
    calls = response.choices[0].message.tool_calls
    assert calls and all(c.function.name == "get_time" for c in calls)
    assert len({c.id for c in calls}) == len(calls)
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), TOOLS[1]["function"]["parameters"])


def test_streamed_tool_call_deltas_assemble(client):
    stream = client.chat.completions.create(
        model=model_id(client),
        messages=[{"role": "user", "content": "What is the weather in Rome?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        temperature=0,
        stream=True,
    )
    calls, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += delta.id or ""
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls"
    assert len(calls) == 1
    assert calls[0]["id"] and calls[0]["name"] == "get_weather"
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER_SCHEMA)


def test_tool_results_round_trip(client):
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "sky": "clear"}'},
    ]
    response = client.chat.completions.create(
        model=model_id(client), messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=40
    )
    assert response.choices[0].message.content
    assert response.choices[0].message.tool_calls is None


def test_response_format_json_schema_validates(client):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    response = client.chat.completions.create(
        model=model_id(client),
        messages=[{"role": "user", "content": "Invent a person and describe them as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
        temperature=0,
        max_tokens=100,
    )
    jsonschema.validate(json.loads(response.choices[0].message.content), schema)


def test_json_object_mode_is_an_object(client):
    response = client.chat.completions.create(
        model=model_id(client),
        messages=[{"role": "user", "content": "Name a fruit. Answer as a JSON object with the key fruit."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=200,
    )
    # Held to an object from the first token; whole once the model ends it
    # (a small model may run on to the budget, which is its choice).
    content = response.choices[0].message.content
    assert content.lstrip().startswith("{"), response
    if response.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_errors_reach_the_client_as_openai_errors(client):
    import openai
    import pytest

    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="no-such-model", messages=FRANCE)
    assert "is not served here" in str(raised.value)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model_id(client), messages=[])
    assert "'messages' must contain at least one message" in str(raised.value)
