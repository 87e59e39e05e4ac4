"""Multiple agents on the real model: a forced spawn_agent starts a child
that decodes in the same batch as its parent, and the official `openai`
client gets an ordinary completion from the delegating turn, streamed and
not. Delegation turned off (per request or per server) declares no
coordination tools, so forcing one is the usual 400."""

import json
import urllib.error
import urllib.request

import openai
import pytest

from conftest import DEFAULT_MODEL

DELEGATE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Ask a helper agent for the capital of France, then tell me."},
]
MODEL = DEFAULT_MODEL.stem
SPAWN = {"type": "function", "function": {"name": "spawn_agent"}}
# The question offers no other tool: delegation is asked for, as a client
# that wants it on a plain request does (`--multi-agent always` would too).
ASK = {"multi_agent": True}


def metrics(server):
    with urllib.request.urlopen(server.url + "/metrics") as response:
        return response.read().decode()


def series(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name} in:\n{text}")


@pytest.fixture
def delegating(start_server):
    # A server of its own, so the batch high-water mark is this test's.
    return start_server("--model", str(DEFAULT_MODEL), "--parallel", "4", "--ctx-size", "8192")


def test_a_forced_spawn_starts_a_child_that_decodes_beside_its_parent(delegating):
    client = openai.OpenAI(base_url=delegating.url + "/v1", api_key="unused")
    response = client.chat.completions.create(
        model=MODEL, messages=DELEGATE, tool_choice=SPAWN, temperature=0, max_tokens=700, extra_body=ASK
    )
    choice = response.choices[0]
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert not choice.message.tool_calls
    assert "<tool_call>" not in choice.message.content
    rounds = response.model_extra["rounds"]
    agents = {r["agent_id"] for r in rounds}
    assert "/root/1" in agents, rounds
    # The children's tokens are the request's.
    assert response.usage.completion_tokens == sum(r["generated_tokens"] for r in rounds)
    text = metrics(delegating)
    assert series(text, "skillhost_agents_spawned_total") >= 1
    assert series(text, "skillhost_batch_sequences_max") >= 2, "the child never decoded beside its parent"
    # A child's prompt opens as its parent's does: that prefix is copied
    # from the parent's sequence, not decoded again.
    child = [r for r in rounds if r["agent_id"] == "/root/1"][0]
    assert child["copied_tokens"] > 0, rounds

    streamed = client.chat.completions.create(
        model=MODEL, messages=DELEGATE, tool_choice=SPAWN, temperature=0, max_tokens=700, stream=True, extra_body=ASK
    )
    content, finish = "", None
    for chunk in streamed:
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish in ("stop", "length")
    assert "<tool_call>" not in content


def test_a_client_that_leaves_mid_turn_stops_its_children_and_frees_their_slots(delegating):
    import http.client
    import time
    from urllib.parse import urlparse

    address = urlparse(delegating.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=120)
    body = {"model": MODEL, "messages": DELEGATE, "tool_choice": SPAWN, "temperature": 0, "max_tokens": 2000, "stream": True, **ASK}
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    deadline = time.monotonic() + 120
    while series(metrics(delegating), "skillhost_agents_open") < 1:
        assert time.monotonic() < deadline, "no child started, so its end would prove nothing"
        time.sleep(0.05)
    connection.close()
    deadline = time.monotonic() + 60
    while True:
        text = metrics(delegating)
        if series(text, "skillhost_agents_open") == 0 and series(text, "skillhost_active_slots") == 0:
            break
        assert time.monotonic() < deadline, f"a child or a slot outlived its client:\n{text}"
        time.sleep(0.05)
    assert series(text, "skillhost_agents_stopped_total") >= 1


def test_delegation_off_declares_no_tools_and_a_forced_spawn_is_refused(client, start_server):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=MODEL, messages=DELEGATE, tool_choice=SPAWN, extra_body={"multi_agent": False}, max_tokens=8
        )
    assert "spawn_agent" in str(refused.value)
    off = start_server("--model", str(DEFAULT_MODEL), "--multi-agent", "off", "--no-skills")
    # The server's off wins over a request that asks.
    body = json.dumps({"messages": DELEGATE, "tool_choice": SPAWN, "max_tokens": 8, **ASK}).encode()
    request = urllib.request.Request(
        off.url + "/v1/chat/completions", body, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request)
    assert error.value.code == 400
    assert "spawn_agent" in error.value.read().decode()
    # Without skills, code or delegation the model gets no tools at all.
    answer = openai.OpenAI(base_url=off.url + "/v1", api_key="unused").chat.completions.create(
        model=MODEL, messages=DELEGATE, temperature=0, max_tokens=16
    )
    assert answer.usage.prompt_tokens < 100, answer.usage
