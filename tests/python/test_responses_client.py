"""The official `openai` client's Responses API against skillhost and the
real model: text, streaming (typed events, validated by the SDK), a
function-call round trip with and without `previous_response_id`, stored
responses read back, paged, referenced and deleted through the SDK, their
survival of `kill -9`, and bad input."""

import json
import subprocess
import time

import httpx
import openai
import pytest

from conftest import BINARY, DEFAULT_MODEL, child_env

MODEL = "SmolLM2-135M-Instruct.Q4_1"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_a_response_has_a_message_item(client):
    response = client.responses.create(
        model=MODEL, instructions="You are a helpful assistant.", input="What is the capital of France?",
        max_output_tokens=32, temperature=0,
    )
    assert response.object == "response" and response.status in ("completed", "incomplete")
    message = response.output[0]
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text.strip()
    assert response.usage.input_tokens > 10 and response.usage.output_tokens > 0


def test_a_stream_has_the_typed_events_and_the_same_text(client):
    # The same request first, so that each compared request finds the
    # prompt's cells exactly as the one before it left them. Otherwise the
    # first would prefill the whole prompt in one batch and the second reuse
    # it and decode only its last token, whose logits can differ in the last
    # bits, enough to flip a greedy choice: the two would match only where an
    # earlier test happened to have cached this prompt.
    client.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=24, temperature=0)
    kinds = []
    with client.responses.stream(model=MODEL, input="What is the capital of France?", max_output_tokens=24,
                                 temperature=0) as stream:
        for event in stream:
            kinds.append(event.type)
        # The answer may be cut by its budget: the stream then ends with
        # `response.incomplete`, which the helper's get_final_response()
        # does not take (against OpenAI either); the last event carries it.
        final = event.response
    assert kinds[:2] == ["response.created", "response.in_progress"]
    for kind in ["response.output_item.added", "response.content_part.added", "response.output_text.delta",
                 "response.output_text.done", "response.output_item.done"]:
        assert kind in kinds, kinds
    assert kinds[-1] in ("response.completed", "response.incomplete")
    whole = client.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=24,
                                    temperature=0)
    assert final.output_text == whole.output_text


def test_a_function_call_round_trip(client):
    first = client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=64, temperature=0,
    )
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and call.call_id
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees."}
    # By reference to the stored response...
    followed = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[result], tools=[WEATHER], max_output_tokens=32,
        temperature=0,
    )
    assert followed.previous_response_id == first.id and followed.output
    # ...and with the whole history sent again.
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               result]
    resent = client.responses.create(model=MODEL, input=history, tools=[WEATHER], max_output_tokens=32,
                                     temperature=0)
    assert resent.output
    # Streamed, the call's arguments arrive as their own events.
    with client.responses.stream(
        model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=64, temperature=0,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    assert [item.type for item in final.output if item.type == "function_call"] == ["function_call"]


def test_a_hosted_tool_the_server_does_not_run_is_left_out_and_named(server):
    # Codex declares web_search on every request; unmapped, it is dropped.
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 2, "tools": [{"type": "web_search"}]}
    response = httpx.post(server.url + "/v1/responses", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-skillhost-dropped-tools"] == "web_search"
    assert response.json()["status"] in ("completed", "incomplete")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"input": []}, "'input' is empty"),
        ({"input": 5}, "'input' must be a string or a list"),
        ({"previous_response_id": "resp_unknown"}, "no stored response has the id 'resp_unknown'"),
        ({"tools": [{"type": "mcp", "server_label": "search", "server_url": "https://mcp.example/"}]},
         "'tools[0].server_label' must name one of this server's MCP servers (none are configured), not 'search'"),
        ({"tools": [{"type": "namespace", "name": "crm", "description": "x", "tools": [{"type": "custom", "name": "x"}]}]},
         "function tools only"),
        ({"max_output_tokens": 0}, "'max_output_tokens' must be at least 1"),
        ({"tools": [{"type": "function", "name": "w", "parameters": []}]}, "tools[0].parameters must be"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "refers to the item 'x', which no stored response"),
        ({"frobnicate": True}, "unknown field `frobnicate`"),
        ({"background": True, "store": False}, "'background' needs 'store'"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
         "'input[0].content[0].image_url' is a URL; this server fetches nothing from the network"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_url": "https://x/y.pdf"}]}]},
         "'input[0].content[0].file_url' is a URL"),
        ({"text": {"format": {"type": "yaml"}}}, "'text.format.type' must be"),
        ({"temperature": "hot"}, "'temperature' is invalid"),
    ],
)
def test_bad_input_is_a_400_in_openai_shape(server, change, message):
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 8, **change}
    response = httpx.post(server.url + "/v1/responses", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and message in error["message"], error


# Every field of the request, each with a value of the wrong type.
WRONG_TYPES = {
    "model": 5, "input": 5, "instructions": 5, "tools": 5, "tool_choice": 5, "parallel_tool_calls": "x",
    "max_output_tokens": "x", "temperature": "x", "top_p": "x", "text": 5, "stream": "x", "store": "x",
    "previous_response_id": 5, "reasoning": 5, "metadata": 5, "user": 5, "skills": 5, "skills_discovery": "x",
    "presence_penalty": "x", "frequency_penalty": "x", "top_logprobs": "x", "truncation": 5, "include": 5,
    "prompt_cache_key": 5, "safety_identifier": 5, "service_tier": 5, "background": "x",
}


@pytest.mark.parametrize("field", sorted(WRONG_TYPES))
def test_each_field_of_the_wrong_type_is_a_400_naming_it(server, field):
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 4, field: WRONG_TYPES[field]}
    response = httpx.post(server.url + "/v1/responses", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and f"'{field}'" in error["message"], error


def test_a_namespaced_function_call_round_trip(client):
    crm = {"type": "namespace", "name": "crm", "description": "Customer records.", "tools": [
        {"type": "function", "name": "lookup", "description": "Find a customer by id.",
         "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}},
    ]}
    first = client.responses.create(
        model=MODEL, input="Who is customer 7?", tools=[crm], tool_choice="required", parallel_tool_calls=False,
        max_output_tokens=48, temperature=0,
    )
    call = next(item for item in first.output if item.type == "function_call")
    assert (call.namespace, call.name) == ("crm", "lookup"), call
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Ada Lovelace"}
    followed = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[result], tools=[crm], max_output_tokens=16, temperature=0,
    )
    assert followed.output and followed.usage.input_tokens > first.usage.input_tokens


def test_a_stored_response_round_trips_through_the_sdk(client):
    made = client.responses.create(
        model=MODEL, instructions="Be brief.", max_output_tokens=8, temperature=0, metadata={"case": "stored"},
        input=[{"role": "user", "content": f"Question {n}."} for n in range(3)],
    )
    read = client.responses.retrieve(made.id)
    assert read.model_dump() == made.model_dump()
    assert (read.instructions, read.metadata, read.temperature) == ("Be brief.", {"case": "stored"}, 0)
    # The SDK follows the cursor page by page; the items come back as sent.
    items = list(client.responses.input_items.list(made.id, limit=1, order="asc"))
    assert [item.content[0].text for item in items] == ["Question 0.", "Question 1.", "Question 2."]
    newest = client.responses.input_items.list(made.id, limit=2)
    assert [item.content[0].text for item in newest.data] == ["Question 2.", "Question 1."] and newest.has_more
    # An item of the stored answer, by reference.
    answer = next(item for item in made.output if item.type == "message")
    referenced = client.responses.create(
        model=MODEL, max_output_tokens=8, temperature=0,
        input=[{"type": "item_reference", "id": answer.id}, {"role": "user", "content": "Thanks."}],
    )
    first = client.responses.input_items.list(referenced.id, order="asc").data[0]
    assert (first.id, first.type) == (answer.id, "message")
    client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, previous_response_id=made.id, input="More.", max_output_tokens=4)


def test_store_false_is_answered_and_forgotten(client):
    made = client.responses.create(model=MODEL, input="Hi.", max_output_tokens=4, temperature=0, store=False)
    assert made.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)


def test_stored_responses_survive_kill_9_and_the_folder_is_one_servers(start_server, tmp_path):
    state = tmp_path / "state"
    args = ["--model", str(DEFAULT_MODEL), "--ctx-size", "2048", "--state-dir", str(state)]
    first = start_server(*args)
    sdk = openai.OpenAI(base_url=first.url + "/v1", api_key="unused")
    made = sdk.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=6, temperature=0)
    # A second server on the same folder is refused with a sentence.
    second = subprocess.run(
        [str(BINARY), "serve", "--host", "127.0.0.1", "--port", "0", "--no-skills", *args],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )
    assert second.returncode != 0 and "in use by another skillhost process" in second.stderr, second.stderr
    # The answer was acknowledged, so a crash right after it keeps it.
    first.kill()
    again = start_server(*args)
    sdk = openai.OpenAI(base_url=again.url + "/v1", api_key="unused")
    assert sdk.responses.retrieve(made.id).model_dump() == made.model_dump()
    followed = sdk.responses.create(
        model=MODEL, previous_response_id=made.id, input="Another.", max_output_tokens=6, temperature=0,
    )
    assert followed.usage.input_tokens > made.usage.input_tokens


def test_a_newer_or_damaged_store_stops_start_up_and_is_left_alone(tmp_path):
    import sqlite3

    state = tmp_path / "state"
    state.mkdir()
    database = state / "state.db"
    sqlite3.connect(database).execute("CREATE TABLE notes (body TEXT)").connection.commit()
    before = database.read_bytes()
    run = subprocess.run(
        [str(BINARY), "serve", "--host", "127.0.0.1", "--port", "0", "--no-skills", "--model", str(DEFAULT_MODEL),
         "--state-dir", str(state)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )
    assert run.returncode != 0 and "is not a skillhost store" in run.stderr, run.stderr
    assert database.read_bytes() == before


def _on_scripted(start_server, tmp_path, script, delay=0.0):
    from scripted_upstream import ScriptedUpstream

    upstream = ScriptedUpstream(script, delay=delay)
    args = ["--upstream", f"{upstream.url},mode=chat", "--state-dir", str(tmp_path / "state")]
    server = start_server(*args)
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    return upstream, server, sdk, args, sdk.models.list().data[0].id


def _settled(sdk, response_id):
    while True:
        response = sdk.responses.retrieve(response_id)
        if response.status not in ("queued", "in_progress"):
            return response
        time.sleep(0.05)


def test_a_background_response_runs_with_no_client_and_can_be_cancelled(start_server, tmp_path):
    from scripted_upstream import say

    story = " ".join(f"word{n}" for n in range(400))
    answers = iter(["Done.", story])
    upstream, _, sdk, _, model = _on_scripted(start_server, tmp_path, lambda body: say(next(answers)), delay=0.05)
    try:
        made = sdk.responses.create(model=model, input="Go.", background=True)
        assert made.background is True and made.status in ("queued", "in_progress")
        done = _settled(sdk, made.id)
        assert (done.status, done.output_text) == ("completed", "Done.")
        # The story takes 20 s to write: the cancel comes long before it ends.
        running = sdk.responses.create(model=model, input="Tell a story.", background=True)
        cancelled = sdk.responses.cancel(running.id)
        assert cancelled.status == "cancelled"
        assert sdk.responses.retrieve(running.id).status == "cancelled"
    finally:
        upstream.close()


def test_a_background_response_cut_by_kill_9_says_the_server_stopped(start_server, tmp_path):
    from scripted_upstream import say

    story = " ".join(f"word{n}" for n in range(400))
    upstream, server, sdk, args, model = _on_scripted(start_server, tmp_path, lambda body: say(story), delay=0.05)
    try:
        running = sdk.responses.create(model=model, input="Tell a story.", background=True)
        server.kill()
        again = start_server(*args)
        sdk = openai.OpenAI(base_url=again.url + "/v1", api_key="unused")
        failed = sdk.responses.retrieve(running.id)
        assert failed.status == "failed", failed
        assert "the server stopped" in failed.error.message
    finally:
        upstream.close()


def test_a_background_stream_is_resumed_by_the_sdk_from_any_event(start_server, tmp_path):
    from scripted_upstream import say

    words = " ".join(f"part{n}" for n in range(30))
    upstream, _, sdk, _, model = _on_scripted(start_server, tmp_path, lambda body: say(words), delay=0.02)
    try:
        stream = sdk.responses.create(model=model, input="Go.", background=True, stream=True)
        first = []
        for event in stream:
            first.append(event)
            if len(first) == 5:
                # The client leaves mid-stream; the turn goes on.
                stream.close()
                break
        response_id = first[0].response.id
        assert first[0].type == "response.created" and first[0].response.background is True
        resumed = list(sdk.responses.retrieve(response_id, stream=True, starting_after=first[-1].sequence_number))
        assert resumed[0].sequence_number == first[-1].sequence_number + 1
        assert resumed[-1].type == "response.completed", [e.type for e in resumed]
        text = "".join(e.delta for e in first + resumed if e.type == "response.output_text.delta")
        assert text == words == resumed[-1].response.output_text
        assert sdk.responses.retrieve(response_id).status == "completed"
    finally:
        upstream.close()


def test_a_compaction_round_trips_through_the_sdk(start_server, tmp_path):
    from scripted_upstream import say, text_of

    def script(body):
        asked = text_of(body["messages"][-1])
        return say("Summary: a trip to Rome, sunny." if "condense a conversation" in asked else "Pack light.")

    upstream, _, sdk, _, model = _on_scripted(start_server, tmp_path, script)
    try:
        first = sdk.responses.create(model=model, input="Plan a trip to Rome.")
        compacted = sdk.responses.compact(model=model, previous_response_id=first.id)
        assert compacted.object == "response.compaction"
        assert [item.type for item in compacted.output] == ["message", "compaction"]
        assert compacted.output[0].content[0].text == "Plan a trip to Rome."
        assert compacted.usage.output_tokens > 0
        items = [item.to_dict() for item in compacted.output]
        follow = sdk.responses.create(model=model, input=[*items, {"role": "user", "content": "What do I pack?"}])
        assert follow.output_text == "Pack light."
        sent = [text_of(m) for m in upstream.requests[-1]["messages"]]
        assert "Summary: a trip to Rome, sunny." in sent, sent
    finally:
        upstream.close()


def test_the_websocket_mode_runs_turns_over_one_connection(start_server, tmp_path):
    from scripted_upstream import say

    answers = iter(["Paris.", "Rome."])
    upstream, _, sdk, _, model = _on_scripted(start_server, tmp_path, lambda body: say(next(answers)))
    try:
        with sdk.responses.connect() as connection:
            def turn(**fields):
                connection.send({"type": "response.create", "model": model, **fields})
                events = []
                for event in connection:
                    events.append(event)
                    if event.type in ("response.completed", "response.failed", "error"):
                        return events
            first = turn(input="Capital of France?")
            assert first[0].type == "response.created" and first[-1].type == "response.completed", first
            assert first[-1].response.output_text == "Paris."
            # The next turn continues the first over the same socket.
            second = turn(input="And Italy?", previous_response_id=first[-1].response.id)
            assert second[-1].response.output_text == "Rome."
            assert "Capital of France?" in str(upstream.requests[-1]["messages"])
            # A refused event is an error event, and the socket stays open.
            connection.send({"type": "response.create", "model": model, "input": "x", "background": True})
            refused = connection.recv()
            assert refused.type == "error" and "background" in refused.message, refused
        assert sdk.responses.retrieve(first[-1].response.id).status == "completed"
    finally:
        upstream.close()


def _socket_turn(connection, **fields):
    """Sends one response.create and reads its events to the last one."""
    connection.send({"type": "response.create", **fields})
    events = []
    for event in connection:
        events.append(event)
        if event.type in ("response.completed", "response.incomplete", "response.failed", "error"):
            return events
    raise AssertionError(f"the socket closed after {events}")


def test_the_websocket_mode_continues_its_last_response_without_the_store(start_server, tmp_path):
    from scripted_upstream import say, text_of

    answers = iter(["Paris.", "Rome.", "Madrid."])
    upstream, _, sdk, _, model = _on_scripted(start_server, tmp_path, lambda body: say(next(answers)))
    try:
        with sdk.responses.connect() as connection:
            # A warm-up names the instructions and first input, generates
            # nothing, and is a response a turn continues from.
            warm = _socket_turn(connection, model=model, store=False, generate=False,
                                instructions="Answer with a city.", input="I ask about capitals.")
            assert [event.type for event in warm] == ["response.created", "response.in_progress",
                                                      "response.completed"], warm
            assert warm[-1].response.output == [] and upstream.requests == []
            first = _socket_turn(connection, model=model, store=False, input="France?",
                                 instructions="Answer with a city.", previous_response_id=warm[-1].response.id)
            assert first[-1].response.output_text == "Paris."
            second = _socket_turn(connection, model=model, store=False, input="Italy?",
                                  instructions="Answer with a city.", previous_response_id=first[-1].response.id)
            assert second[-1].response.output_text == "Rome."
            said = [text_of(message) for message in upstream.requests[-1]["messages"]]
            assert said == ["Answer with a city.", "I ask about capitals.", "France?", "Paris.", "Italy?"], said
            # Only the latest response is kept, and nothing was stored.
            older = _socket_turn(connection, model=model, store=False, input="x",
                                 previous_response_id=first[-1].response.id)
            assert (older[-1].type, older[-1].code) == ("error", "previous_response_not_found"), older
            # A refused turn forgets the last response too, as OpenAI's socket does.
            forgotten = _socket_turn(connection, model=model, store=False, input="x",
                                     previous_response_id=second[-1].response.id)
            assert forgotten[-1].code == "previous_response_not_found", forgotten
            # An event longer than one 64 KiB frame of the WebSocket library's default.
            long = _socket_turn(connection, model=model, store=False, input="Spain? " + "x" * 200_000)
            assert long[-1].response.output_text == "Madrid."
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.responses.create(model=model, input="x", previous_response_id=second[-1].response.id)
        assert refused.value.code == "previous_response_not_found"
    finally:
        upstream.close()


def test_the_websocket_mode_refuses_a_second_turn_while_one_runs_and_answers_pings(start_server, tmp_path):
    from scripted_upstream import say
    from websockets.sync.client import connect

    story = " ".join(f"word{n}" for n in range(60))
    upstream, server, sdk, _, model = _on_scripted(start_server, tmp_path, lambda body: say(story), delay=0.05)
    try:
        url = server.url.replace("http://", "ws://") + "/v1/responses"
        with connect(url, max_size=None) as socket:
            create = json.dumps({"type": "response.create", "model": model, "input": "Tell a story."})
            socket.send(create)
            socket.send(create)
            kinds, pongs = [], []
            while True:
                event = json.loads(socket.recv(timeout=30))
                kinds.append((event["type"], event.get("code")))
                if event["type"] == "response.output_text.delta" and not pongs:
                    # Answered mid-turn: a client closes a socket whose pings go unanswered.
                    pongs.append(socket.ping().wait(timeout=10))
                if event["type"] == "response.completed":
                    break
            assert ("error", "conflict") in kinds, kinds
            assert pongs == [True]
            assert kinds.count(("response.created", None)) == 1, kinds
    finally:
        upstream.close()


def _text(item):
    content = item.content if hasattr(item, "content") else item["content"]
    if isinstance(content, str):
        return content
    return "".join(part.text if hasattr(part, "text") else part["text"] for part in content)


def test_a_conversation_is_kept_continued_and_deleted_through_the_sdk(start_server, tmp_path):
    from scripted_upstream import say, text_of

    answers = iter(["Paris.", "Rome."])
    upstream, server, sdk, args, model = _on_scripted(start_server, tmp_path, lambda body: say(next(answers)))
    try:
        made = sdk.conversations.create(items=[{"type": "message", "role": "user", "content": "I like capitals."}],
                                        metadata={"topic": "geography"})
        assert made.id.startswith("conv_") and made.metadata == {"topic": "geography"}
        first = sdk.responses.create(model=model, conversation=made.id, input="France?")
        assert first.output_text == "Paris."
        second = sdk.responses.create(model=model, conversation={"id": made.id}, input="Italy?")
        assert second.output_text == "Rome."
        said = [text_of(message) for message in upstream.requests[-1]["messages"]]
        assert {"I like capitals.", "France?", "Paris.", "Italy?"} <= set(said), said

        # After kill -9 the conversation is still there, item by item.
        server.kill()
        again = start_server(*args)
        sdk = openai.OpenAI(base_url=again.url + "/v1", api_key="unused")
        items = list(sdk.conversations.items.list(made.id, order="asc"))
        assert [_text(item) for item in items] == ["I like capitals.", "France?", "Paris.", "Italy?", "Rome."]
        assert sdk.conversations.retrieve(made.id).metadata == {"topic": "geography"}
        updated = sdk.conversations.update(made.id, metadata={"topic": "done"})
        assert updated.metadata == {"topic": "done"}
        added = sdk.conversations.items.create(made.id, items=[{"type": "message", "role": "user", "content": "Bye."}])
        assert [_text(item) for item in added.data] == ["Bye."]
        assert sdk.conversations.items.retrieve(added.data[0].id, conversation_id=made.id).role == "user"
        sdk.conversations.items.delete(added.data[0].id, conversation_id=made.id)
        deleted = sdk.conversations.delete(made.id)
        assert deleted.deleted is True
        with pytest.raises(openai.NotFoundError):
            sdk.conversations.retrieve(made.id)
    finally:
        upstream.close()


def test_the_agents_sdk_keeps_its_session_in_a_server_conversation(start_server, tmp_path, monkeypatch):
    import asyncio

    from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
    from agents.memory import OpenAIConversationsSession
    from scripted_upstream import say, text_of

    # Traces would go to OpenAI's servers: nothing leaves 127.0.0.1.
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    set_tracing_disabled(True)
    answers = iter(["Hello, Ada.", "Your name is Ada."])
    upstream, server, sdk, _, model = _on_scripted(start_server, tmp_path, lambda body: say(next(answers)))

    async def two_turns():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused")
        agent = Agent(name="helper", instructions="Be brief.",
                      model=OpenAIResponsesModel(model=model, openai_client=client))
        session = OpenAIConversationsSession(openai_client=client)
        first = await Runner.run(agent, "My name is Ada.", session=session)
        second = await Runner.run(agent, "What is my name?", session=session)
        return session.session_id, first.final_output, second.final_output

    try:
        conversation, first, second = asyncio.run(two_turns())
        assert (first, second) == ("Hello, Ada.", "Your name is Ada.")
        # The second turn's prompt held the first, read back from the server.
        said = [text_of(message) for message in upstream.requests[-1]["messages"]]
        assert "My name is Ada." in said and "Hello, Ada." in said, said
        items = list(sdk.conversations.items.list(conversation, order="asc"))
        texts = [_text(item) for item in items]
        assert texts == ["My name is Ada.", "Hello, Ada.", "What is my name?", "Your name is Ada."], texts
    finally:
        upstream.close()


def test_input_tokens_counts_what_a_response_then_reports(client):
    asked = {"instructions": "You are a helpful assistant.", "input": "Name a colour."}
    counted = client.responses.input_tokens.count(model=MODEL, **asked)
    assert counted.object == "response.input_tokens"
    response = client.responses.create(model=MODEL, max_output_tokens=4, temperature=0, **asked)
    assert counted.input_tokens == response.usage.input_tokens
    # A follow-up counts the turn it continues; tools count too.
    follow = client.responses.input_tokens.count(model=MODEL, previous_response_id=response.id, input="Another.")
    assert follow.input_tokens > counted.input_tokens
    with_tools = client.responses.input_tokens.count(model=MODEL, input="Name a colour.", tools=[WEATHER])
    alone = client.responses.input_tokens.count(model=MODEL, input="Name a colour.")
    assert with_tools.input_tokens > alone.input_tokens > 0
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_tokens.count(model=MODEL, input="x", extra_body={"max_output_tokens": 4})
    assert "max_output_tokens" in str(refused.value)
