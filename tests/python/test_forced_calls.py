"""What agent clients see when they force a tool, on the real model: a
named function comes back as exactly one call, repeats of a call never
reach the client, generation stops where the call list is complete, and a
call cut short by the budget comes back in each surface's shape (the
`openai`, `anthropic` and `ollama` packages, and LangChain's ChatOpenAI,
unchanged). Counts and finishes are asserted, never the model's words:
the grammar decides the call, the model only fills its arguments."""

import json

import anthropic
import ollama
import pytest
from openai import OpenAI

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather in a city.", "parameters": WEATHER_SCHEMA},
}
# Ten required fields: a call to it does not fit in 32 tokens.
FORM_SCHEMA = {
    "type": "object",
    "properties": {f"field_{i}": {"type": "string"} for i in range(10)},
    "required": [f"field_{i}" for i in range(10)],
}
FORM = {
    "type": "function",
    "function": {"name": "fill_form", "description": "Submit the sign-up form.", "parameters": FORM_SCHEMA},
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
ASK_FORM = [{"role": "user", "content": "Sign me up: fill in every field of the form."}]
CUT = 32


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="unused")


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def weather_call(client, model, **extra):
    return client.chat.completions.create(model=model, messages=ASK_WEATHER, tools=[WEATHER], temperature=0, **extra)


@pytest.fixture(scope="module")
def one_call(client, model):
    """The size of one call: the same forced call with parallel calls off,
    where the grammar holds exactly one. Asked twice, so the measured
    request finds the prompt cached as the compared ones will."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    weather_call(client, model, tool_choice=named, parallel_tool_calls=False)
    response = weather_call(client, model, tool_choice=named, parallel_tool_calls=False)
    assert len(response.choices[0].message.tool_calls) == 1
    return response.usage.completion_tokens


def test_a_named_function_is_one_call_however_parallel_calls_are_set(client, model, one_call):
    named = {"type": "function", "function": {"name": "get_weather"}}
    # No max_tokens and parallel calls left on (the default): as LangChain's
    # bind_tools(tool_choice=...) sends it.
    response = weather_call(client, model, tool_choice=named)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    json.loads(choice.message.tool_calls[0].function.arguments)
    # Generation ended with the call: the tokens are one call's, give or
    # take the arguments the model chose (before: eight calls, 296 tokens).
    assert response.usage.completion_tokens <= one_call + 8, (response.usage, one_call)


def test_required_with_parallel_calls_drops_repeats_and_stops_at_the_first(client, model, one_call):
    for _ in range(2):
        response = weather_call(client, model, tool_choice="required")
        calls = response.choices[0].message.tool_calls
        assert response.choices[0].finish_reason == "tool_calls"
        seen = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
        assert all(seen.count(call) == 1 for call in seen), seen
        # Each call the client gets, plus at most the repeat that ended the
        # list, costs about one call's tokens; never the list's cap of eight.
        assert response.usage.completion_tokens <= (len(calls) + 1) * (one_call + 8), (response.usage, seen)


def test_a_call_cut_by_max_tokens_comes_back_on_chat_completions(client, model):
    named = {"type": "function", "function": {"name": "fill_form"}}
    response = client.chat.completions.create(
        model=model, messages=ASK_FORM, tools=[FORM], tool_choice=named, temperature=0, max_completion_tokens=CUT
    )
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert response.usage.completion_tokens == CUT
    [call] = choice.message.tool_calls
    assert call.function.name == "fill_form" and call.id
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.function.arguments)
    assert call.function.arguments.startswith("{")


def test_a_call_cut_by_max_output_tokens_is_incomplete_on_responses(client, model):
    tools = [{"type": "function", "name": "fill_form", "parameters": FORM_SCHEMA}]
    request = dict(
        model=model, input=ASK_FORM, tools=tools, tool_choice={"type": "function", "name": "fill_form"},
        temperature=0, max_output_tokens=CUT,
    )
    response = client.responses.create(**request)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    [item] = [item for item in response.output if item.type == "function_call"]
    assert item.name == "fill_form" and item.status == "incomplete"
    # The stream ends with `response.incomplete`, as OpenAI's does.
    events = list(client.responses.create(**request, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.status == "incomplete"
    assert "response.completed" not in {event.type for event in events}


def test_a_call_cut_by_max_tokens_is_a_tool_use_block_on_messages(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    tool = {"name": "fill_form", "description": "Submit the sign-up form.", "input_schema": FORM_SCHEMA}
    message = client.messages.create(
        model="SmolLM2-135M-Instruct.Q4_1", max_tokens=CUT, messages=ASK_FORM, tools=[tool],
        tool_choice={"type": "tool", "name": "fill_form"}, extra_body={"temperature": 0},
    )
    assert message.stop_reason == "max_tokens"
    [block] = [block for block in message.content if block.type == "tool_use"]
    assert block.name == "fill_form" and isinstance(block.input, dict)
    # The part written whole, never a field the model did not reach.
    assert set(block.input) < set(FORM_SCHEMA["properties"])


def test_a_call_cut_by_num_predict_is_in_ollamas_tool_calls(server):
    # Ollama's API cannot force a call; the header does (Open WebUI and
    # other Ollama clients can add one to every request).
    client = ollama.Client(host=server.url + "/ollama", headers={"x-skillhost-tool-choice": "fill_form"})
    model = client.list().models[0].model
    reply = client.chat(
        model=model, messages=ASK_FORM, tools=[FORM], options={"temperature": 0, "num_predict": CUT}, stream=False
    )
    assert reply.done_reason == "length"
    [call] = reply.message.tool_calls
    assert call.function.name == "fill_form" and isinstance(call.function.arguments, dict)


def test_langchain_bind_tools_gets_one_call_and_sees_a_cut_call_as_invalid(server, model):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "Sunny"

    llm = ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model=model, temperature=0)
    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert [call["name"] for call in message.tool_calls] == ["get_weather"]
    assert not message.invalid_tool_calls

    short = ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model=model, temperature=0, max_tokens=CUT)
    cut = short.bind_tools([FORM], tool_choice="fill_form").invoke(ASK_FORM[0]["content"])
    assert cut.response_metadata["finish_reason"] == "length"
    assert not cut.tool_calls
    assert [call["name"] for call in cut.invalid_tool_calls] == ["fill_form"]
