"""Concurrency, disconnects and the no-template model, over real HTTP."""

import http.client
import json
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from conftest import DEFAULT_MODEL, GEMMA_MODEL

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def post(url, body):
    parsed = urllib.parse.urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    return connection, connection.getresponse()


def test_eight_concurrent_streams_all_finish(client):
    prompts = [f"Write one sentence about the number {n}." for n in range(8)]
    results = [None] * 8

    def run(index):
        stream = client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[SYSTEM, {"role": "user", "content": prompts[index]}],
            max_tokens=32,
            temperature=0.7,
            seed=index,
            stream=True,
        )
        text, finish = "", None
        for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        results[index] = (text, finish)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r is not None and r[1] in ("stop", "length") for r in results), results


def wait_for(condition, what, server=None):
    # A readiness poll, not a timing assertion: it only bounds a hang.
    for _ in range(600):
        if condition():
            return
        time.sleep(0.1)
    log = "".join(server.log) if server else ""
    raise AssertionError(f"never happened: {what}\n{log}")


def test_a_disconnected_stream_frees_its_slot(start_server):
    server = start_server("--model", str(DEFAULT_MODEL), "--parallel", "1", "--ctx-size", "4096")
    long_request = {
        "messages": [SYSTEM, {"role": "user", "content": "Count from one to one thousand, in words."}],
        "max_tokens": 3000,
        "temperature": 0,
        # Without it a small model may end the count early, and there would
        # be nothing left to cancel.
        "ignore_eos": True,
        "stream": True,
    }
    connection, response = post(server.url, long_request)
    assert response.status == 200
    response.fp.readline()  # the first frame arrived: the request holds the only slot
    connection.sock.close()
    connection.close()
    wait_for(lambda: server.metric("skillhost_cancelled_requests") == 1, "the engine cancelled the request", server)
    assert server.metric("skillhost_active_slots") == 0

    # The only slot serves the next request.
    connection, response = post(
        server.url, {"messages": [SYSTEM, {"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}
    )
    body = json.loads(response.read())
    connection.close()
    assert response.status == 200, body
    assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_disconnected_non_streaming_request_is_cancelled(start_server):
    server = start_server("--model", str(DEFAULT_MODEL), "--parallel", "1", "--ctx-size", "4096")
    long_request = {
        "messages": [SYSTEM, {"role": "user", "content": "Count from one to one thousand, in words."}],
        "max_tokens": 3000,
        "temperature": 0,
        "ignore_eos": True,
    }
    parsed = urllib.parse.urlparse(server.url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port)
    connection.request("POST", "/v1/chat/completions", json.dumps(long_request), {"Content-Type": "application/json"})
    wait_for(lambda: server.metric("skillhost_active_slots") == 1, "the request started", server)
    connection.sock.close()
    connection.close()
    wait_for(lambda: server.metric("skillhost_cancelled_requests") == 1, "the engine cancelled the request", server)


def test_the_no_template_model_is_served_with_a_logged_fallback(start_server):
    server = start_server("--model", str(GEMMA_MODEL), "--ctx-size", "2048")
    log = "".join(server.log)
    assert "built-in 'gemma' format (the model has no chat template)" in log, log
    connection, response = post(
        server.url, {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16, "temperature": 0}
    )
    body = json.loads(response.read())
    connection.close()
    assert response.status == 200, body
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    assert body["usage"]["completion_tokens"] > 0


def shared_system():
    rules = " ".join(f"Rule {i}: answer in one short sentence." for i in range(1, 41))
    return {"role": "system", "content": "You are a helpful assistant. " + rules}


def test_a_shared_system_prompt_is_copied_and_survives_a_restart(start_server, tmp_path):
    """Through the OpenAI client: a conversation that arrives while another
    with the same system prompt is generating copies that prompt's cells; the
    prefix is saved, and after a restart the first request copies it again."""
    from openai import OpenAI

    args = ["--model", str(DEFAULT_MODEL), "--parallel", "4", "--prefix-cache", str(tmp_path)]
    server = start_server(*args)
    # The kernel kills commands (1000) before the server when memory runs
    # out; lowering the server's own score needs CAP_SYS_RESOURCE, which a
    # container's root may lack, and the log says which it was.
    adj = Path(f"/proc/{server.process.pid}/oom_score_adj").read_text().strip()
    assert adj == "-500" or "cannot lower this server's OOM priority" in "".join(server.log), adj
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    system = shared_system()
    running = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=[system, {"role": "user", "content": "Tell me a long story."}],
        max_tokens=200,
        temperature=0,
        stream=True,
    )
    next(chunk for chunk in running if chunk.choices and chunk.choices[0].delta.content)
    second = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=[system, {"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8,
        temperature=0,
    )
    running.close()
    timings = second.model_extra["timings"]
    assert timings["copied_n"] > 300, timings
    assert second.usage.prompt_tokens_details.cached_tokens >= timings["copied_n"]
    assert server.metric("skillhost_prompt_tokens_copied_total") >= timings["copied_n"]
    saved = sorted(p.suffix for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert saved == [".json", ".kv"], saved
    # Records are signed with a key only the server's user can read.
    assert (tmp_path / ".skillhost-prefix-key").stat().st_mode & 0o777 == 0o600
    server.stop()

    restarted = start_server(*args)
    client = OpenAI(base_url=restarted.url + "/v1", api_key="unused")
    third = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=[system, {"role": "user", "content": "What is the capital of Italy?"}],
        max_tokens=8,
        temperature=0,
    )
    timings = third.model_extra["timings"]
    assert timings["copied_n"] > 300 and timings["prompt_n"] < 40, timings
    # The model loads while the server already listens; by now it has.
    assert "restored the shared prefix" in "".join(restarted.log), "".join(restarted.log)


@pytest.mark.parametrize("drafting", [[], ["--spec-lookup=false"]], ids=["default", "off"])
def test_drafting_from_the_context_is_on_by_default_and_counted(start_server, drafting):
    """On the CPU the server drafts from each sequence's context unless told
    not to (`--spec-lookup=false`), and reports the drafts as llama-server
    does (`timings.draft_n`, `draft_n_accepted`) and in /metrics. The
    schema's only value is a line of the prompt, so the grammar makes the
    model write that line whatever its weights prefer: once its first words
    are out, the rest is found in the prompt, drafted and kept."""
    from openai import OpenAI

    server = start_server("--model", str(DEFAULT_MODEL), "--no-skills", *drafting)
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    line = "the quick brown fox jumps over the lazy dog beside the old stone bridge at dawn"
    schema = {
        "type": "object",
        "properties": {"line": {"type": "string", "enum": [line]}},
        "required": ["line"],
        "additionalProperties": False,
    }
    answer = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[SYSTEM, {"role": "user", "content": f"Copy this line exactly: {line}"}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "copy", "schema": schema}},
    )
    assert json.loads(answer.choices[0].message.content) == {"line": line}
    timings = answer.model_extra["timings"]
    if drafting:
        assert timings["draft_n"] == timings["draft_n_accepted"] == 0, timings
    else:
        assert 0 < timings["draft_n_accepted"] <= timings["draft_n"], timings
    assert server.metric("skillhost_draft_tokens_total") == timings["draft_n"]
    assert server.metric("skillhost_draft_accepted_tokens_total") == timings["draft_n_accepted"]
