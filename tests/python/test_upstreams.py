"""skillhost in front of real llama.cpp servers (`--upstream`): two
llama-servers on the default model, built from the llama.cpp tree in the
llama-cpp-python sdist (`scripts/build-llama-server.sh`, cached under
~/.cache/skillhost), and skillhost with both as upstreams."""

import json
import math
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import DEFAULT_MODEL, ROOT, RunningServer

MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"
SKILLS = ROOT / "skills"
# Long enough that an upstream can be killed while it prefills.
LONG_SYSTEM = "You are a helpful assistant. " + " ".join(
    f"Rule {i}: keep every answer short, plain and friendly." for i in range(1, 181)
)


def llama_server_binary():
    named = os.environ.get("LLAMA_SERVER")
    if named:
        return Path(named)
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-llama-server.sh"), "--path"], capture_output=True, text=True, check=False
    )
    return Path(built.stdout.strip())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One llama-server on the default model; it can be killed and started
    again on the same port."""

    def __init__(self, *extra):
        self.binary = llama_server_binary()
        if not self.binary.exists():
            pytest.fail(f"{self.binary} is missing: run `make llama-server` (make test builds it)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra = extra
        self.process = None
        self.start()

    def start(self):
        self.process = subprocess.Popen(
            [str(self.binary), "-m", str(DEFAULT_MODEL), "--host", "127.0.0.1", "--port", str(self.port),
             "-c", "16384", "-np", "4", "-t", "1", "-tb", "1", "--no-webui", *self.extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        pytest.fail(f"llama-server on {self.url} never became healthy")

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture(scope="module")
def upstreams():
    started = [LlamaServer("--jinja"), LlamaServer("--jinja")]
    yield started
    for upstream in started:
        upstream.stop()


@pytest.fixture(scope="module")
def fronted(upstreams):
    """skillhost with both upstreams in completion mode and the repo's skills."""
    args = [arg for u in upstreams for arg in ("--upstream", u.url)]
    server = RunningServer([*args, "--skills-dir", str(SKILLS), "--parallel", "8"])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def plain(upstreams):
    """skillhost with both upstreams and no skills: the prompt's opening is
    the request's own, so a test can tell each conversation's home."""
    args = [arg for u in upstreams for arg in ("--upstream", u.url)]
    server = RunningServer([*args, "--no-skills", "--parallel", "8"])
    yield server
    server.stop()


def post(url, body, headers=None, timeout=300):
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def metrics(server):
    """{(name, upstream, result): value} of the upstream series."""
    out = {}
    with urllib.request.urlopen(server.url + "/metrics") as response:
        for line in response.read().decode().splitlines():
            if not line.startswith("skillhost_upstream_"):
                continue
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            fields = dict(part.split("=", 1) for part in labels.rstrip("}").split(","))
            fields = {k: v.strip('"') for k, v in fields.items()}
            out[(name, fields.get("upstream"), fields.get("result"))] = float(value)
    return out


def upstream_value(server, name, upstream, result=None):
    return metrics(server).get((name, upstream.url, result), 0.0)


# The routing contract, written out here a second time on purpose: every
# replica must send a conversation to the same upstream, so the hash is
# part of the interface (engine/src/remote/fleet.rs).
FNV_OFFSET = 0xCBF29CE484222325
MASK = (1 << 64) - 1


def fnv1a(data, h=FNV_OFFSET):
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & MASK
    return h


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def conversation_key(messages):
    h = FNV_OFFSET
    for m in messages:
        h = fnv1a(m["role"].encode() + b"\0" + m["content"].encode() + b"\0", h)
        if m["role"] == "user":
            return h
    return None


def home(messages, upstreams):
    key = conversation_key(messages)

    def score(upstream):
        draw = ((splitmix64(key ^ fnv1a(upstream.url.encode())) >> 11) + 1) / float(1 << 53)
        return 1.0 / max(-math.log(draw), 1e-300)

    return max(upstreams, key=score)


def opening(index, system="You are a helpful assistant."):
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Conversation {index}: name a colour."}]


def openings_homed(upstreams, per_upstream, system="You are a helpful assistant."):
    """Conversations whose home is each upstream, `per_upstream` of each."""
    chosen = {u.url: [] for u in upstreams}
    index = 0
    while any(len(v) < per_upstream for v in chosen.values()):
        messages = opening(index, system)
        target = home(messages, upstreams)
        if len(chosen[target.url]) < per_upstream:
            chosen[target.url].append(messages)
        index += 1
    return chosen


def read_a_skill(url):
    """A forced skills_read and what follows it. Round 1 must call (which
    skill it names is the model's); what the model does with the result is
    its own, so the turn has two rounds or more, and only their structure is
    checked. Delegation is off: its tools would only invite more rounds.
    Round 2 continues round 1's prompt on the same upstream, so all of round
    1's prompt comes from that upstream's cache."""
    body = post(
        url,
        {
            "messages": [{"role": "user", "content": "Read the skill-authoring skill and say what it is for."}],
            "max_tokens": 300,
            "temperature": 0,
            "parallel_tool_calls": False,
            "multi_agent": False,
        },
        headers={"x-skillhost-tool-choice": "skills_read"},
    )
    rounds = body["rounds"]
    assert len(rounds) >= 2, body
    assert rounds[1]["cached_tokens"] >= rounds[0]["prompt_tokens"], rounds
    return body


def test_a_skills_request_runs_all_its_rounds_on_one_upstream_that_reuses_its_prefix(fronted, upstreams):
    def counts():
        return {
            u.url: (
                upstream_value(fronted, "skillhost_upstream_requests_total", u),
                upstream_value(fronted, "skillhost_upstream_errors_total", u),
            )
            for u in upstreams
        }

    before = counts()
    body = read_a_skill(fronted.url)
    after = counts()
    sent = {url: after[url][0] - before[url][0] for url in after}
    errors = {url: after[url][1] - before[url][1] for url in after}
    # Every request of the turn goes to the same upstream: one per round,
    # and one more for each prompt it refused (counted in its errors).
    # Which file the model reads is its own choice; a large one
    # (skill-authoring's SKILL.md) takes round 2 past the upstream's
    # 4,096-token slot, the upstream answers 400, and the loop sends the
    # round again with the result replaced by a note.
    assert sorted(sent.values())[0] == 0, (sent, errors)
    home = max(sent, key=sent.get)
    assert sent[home] == len(body["rounds"]) + errors[home], (sent, errors, body["rounds"])


def test_eight_concurrent_conversations_spread_and_stick_to_their_upstream(plain, upstreams):
    fronted = plain
    homed = openings_homed(upstreams, 4)
    conversations = [m for group in homed.values() for m in group]
    hits_before = sum(upstream_value(fronted, "skillhost_upstream_affinity_total", u, "hit") for u in upstreams)
    misses_before = sum(upstream_value(fronted, "skillhost_upstream_affinity_total", u, "miss") for u in upstreams)
    requests_before = {u.url: upstream_value(fronted, "skillhost_upstream_requests_total", u) for u in upstreams}
    results = [None] * len(conversations)

    def turn(i, messages):
        results[i] = post(fronted.url, {"messages": messages, "max_tokens": 12, "temperature": 0})

    def all_turns(messages_for):
        threads = [threading.Thread(target=turn, args=(i, messages_for(i))) for i in range(len(conversations))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert all(r is not None for r in results), "a conversation did not finish"

    all_turns(lambda i: conversations[i])
    first = list(results)
    seconds = [
        conversations[i]
        + [{"role": "assistant", "content": first[i]["choices"][0]["message"]["content"]},
           {"role": "user", "content": "And another one?"}]
        for i in range(len(conversations))
    ]
    all_turns(lambda i: seconds[i])
    for i, body in enumerate(results):
        # Turn 2 found its prefix cached where turn 1 ran (which of that
        # upstream's four slots holds it, and so whether the last few
        # tokens of turn 1 are there too, is llama-server's choice).
        cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 0.9 * first[i]["usage"]["prompt_tokens"], (cached, first[i]["usage"])
    hits = sum(upstream_value(fronted, "skillhost_upstream_affinity_total", u, "hit") for u in upstreams) - hits_before
    misses = sum(upstream_value(fronted, "skillhost_upstream_affinity_total", u, "miss") for u in upstreams) - misses_before
    assert (hits, misses) == (16, 0)
    for u in upstreams:
        sent = upstream_value(fronted, "skillhost_upstream_requests_total", u) - requests_before[u.url]
        assert sent == 8, (u.url, sent)


def wait_for(predicate, what, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting until {what}")


def test_a_killed_upstream_is_routed_around_retried_and_used_again_when_back(tmp_path):
    a, b = LlamaServer(), LlamaServer()
    server = RunningServer(["--upstream", a.url, "--upstream", b.url, "--no-skills"])
    try:
        homed = openings_homed([a, b], 3, system=LONG_SYSTEM)
        at_a = homed[a.url]
        # In flight on `a`, before its first token: a long prompt to prefill.
        outcome = {}

        def slow():
            try:
                outcome["body"] = post(server.url, {"messages": at_a[0], "max_tokens": 4, "temperature": 0})
            except Exception as err:  # noqa: BLE001 - the test reports it
                outcome["error"] = err

        thread = threading.Thread(target=slow)
        thread.start()
        wait_for(lambda: upstream_value(server, "skillhost_upstream_in_flight", a) == 1, "the request runs on a", 30)
        time.sleep(0.3)
        a.kill()
        thread.join(300)
        assert "body" in outcome, outcome
        assert outcome["body"]["choices"][0]["message"]["content"] is not None
        assert upstream_value(server, "skillhost_upstream_retried_total", a) == 1
        assert upstream_value(server, "skillhost_upstream_up", a) == 0
        # New conversations homed at `a` go to `b` while it is down.
        b_before = upstream_value(server, "skillhost_upstream_requests_total", b)
        post(server.url, {"messages": at_a[1], "max_tokens": 4, "temperature": 0})
        assert upstream_value(server, "skillhost_upstream_requests_total", b) == b_before + 1
        assert upstream_value(server, "skillhost_upstream_affinity_total", a, "miss") >= 1
        # Back on the same port, its health check brings it back.
        a.start()
        wait_for(lambda: upstream_value(server, "skillhost_upstream_up", a) == 1, "a is up again")
        a_before = upstream_value(server, "skillhost_upstream_requests_total", a)
        post(server.url, {"messages": at_a[2], "max_tokens": 4, "temperature": 0})
        assert upstream_value(server, "skillhost_upstream_requests_total", a) == a_before + 1
        # Killed in the middle of an answer: the stream ends with an error
        # that names the upstream (no other upstream can continue the text).
        request = urllib.request.Request(
            server.url + "/v1/chat/completions",
            data=json.dumps({"messages": at_a[1], "max_tokens": 400, "stream": True, "temperature": 0,
                             "ignore_eos": True}).encode(),
            headers={"content-type": "application/json"},
        )
        frames = []
        with urllib.request.urlopen(request, timeout=120) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                frame = json.loads(line[6:])
                frames.append(frame)
                content = [c.get("delta", {}).get("content") for c in frame.get("choices") or []]
                if any(content) and a.process.poll() is None:
                    a.kill()
        errors = [f["error"]["message"] for f in frames if "error" in f]
        assert errors and "failed in the middle of the answer" in errors[0] and a.url in errors[0], frames[-3:]
        # Every upstream down: a clear 503, not a hang.
        a.kill()
        b.kill()
        wait_for(lambda: upstream_value(server, "skillhost_upstream_up", b) == 0, "b is seen down")
        with pytest.raises(urllib.error.HTTPError) as refused:
            post(server.url, {"messages": at_a[0], "max_tokens": 4}, timeout=60)
        assert refused.value.code == 503
        message = json.loads(refused.value.read())["error"]["message"]
        assert "no upstream can take the request" in message and a.url in message, message
    finally:
        server.stop()
        a.stop()
        b.stop()


def earlier_reads():
    """Three earlier turns that read a skill: the 135M model writes a call
    first only after examples, and llama-server's `required` grammar lets
    it write prose before the call for as long as it likes."""
    turns = []
    for i, skill in enumerate(["skillhost-api", "notes", "weather"]):
        arguments = json.dumps({"skill": skill})
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "skills_read", "arguments": arguments}}
        turns += [
            {"role": "user", "content": f"Read the {skill} skill."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"The {skill} skill."},
            {"role": "assistant", "content": "Done."},
        ]
    return turns


def test_chat_mode_runs_a_forced_skills_round_trip_on_the_upstreams_template():
    # llama-server renders with a template that declares tools (the model's
    # own has none), and parses the calls itself.
    template = Path(__file__).parent / "templates" / "chatml-tools.jinja"
    upstream = LlamaServer("--jinja", "--chat-template-file", str(template))
    server = RunningServer(["--upstream", upstream.url + ",mode=chat", "--skills-dir", str(SKILLS)])
    try:
        assert "the upstream's own chat template (chat mode)" in "".join(server.log)
        body = post(
            server.url,
            {
                "messages": [*earlier_reads(), {"role": "user", "content": "Read the skill-authoring skill."}],
                "max_tokens": 300,
                "temperature": 0,
                "parallel_tool_calls": False,
            },
            headers={"x-skillhost-tool-choice": "skills_read"},
        )
        assert len(body["rounds"]) >= 2, body
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        server.stop()
        upstream.stop()


def test_the_openai_completions_dialect_reuses_the_prefix_and_runs_a_skills_round_trip(upstreams):
    """`api=openai`: /v1/completions, the dialect vLLM, SGLang and TGI speak,
    here against llama-server's own implementation of it."""
    server = RunningServer(["--upstream", upstreams[1].url + ",api=openai", "--skills-dir", str(SKILLS)])
    try:
        # The cached counts come from the dialect's own
        # `usage.prompt_tokens_details.cached_tokens`.
        body = read_a_skill(server.url)
        rounds = body["rounds"]
        assert body["usage"]["completion_tokens"] == sum(r["generated_tokens"] for r in rounds)
    finally:
        server.stop()


def test_the_openai_and_ollama_clients_work_through_upstreams(fronted):
    # What is checked is the clients' protocol through the upstreams: the
    # shapes and counts the server fills in. Whether the model's few tokens
    # make text or the start of a skills call is the model's, so the text is
    # not checked; greedy decoding and no delegation keep the turn the same
    # on every run.
    import ollama
    from openai import OpenAI

    client = OpenAI(base_url=fronted.url + "/v1", api_key="unused")
    greedy = {"temperature": 0, "extra_body": {"multi_agent": False}}
    answer = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=16,
        **greedy,
    )
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].finish_reason in ("stop", "length"), answer
    assert answer.usage.completion_tokens > 0
    streamed = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=16,
        stream=True,
        **greedy,
    )
    finishes = [c.choices[0].finish_reason for c in streamed if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"]), finishes

    native = ollama.Client(host=fronted.url + "/ollama")
    reply = native.chat(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Say hello."}],
        options={"temperature": 0, "num_predict": 16},
    )
    assert reply.message.role == "assistant"
    assert reply.done and reply.done_reason in ("stop", "length"), reply
    assert reply.eval_count > 0


def test_a_plain_question_costs_the_prompt_tokens_it_costs_on_llama_server(server, upstreams):
    """A request that offers no tools gets none of the server's: the
    coordination tools are declared only beside other tools, so the
    question's prompt is the chat template's and nothing more, as on
    llama-server (both render the model's own template)."""
    for messages in (
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "What is the capital of France?"}],
    ):
        body = {"messages": messages, "max_tokens": 1, "temperature": 0}
        ours = post(server.url, body)["usage"]["prompt_tokens"]
        theirs = post(upstreams[0].url, body)["usage"]["prompt_tokens"]
        assert ours == theirs, (messages, ours, theirs)


def llama_metric(upstream, name):
    """A counter from llama-server's own /metrics (started with --metrics)."""
    with urllib.request.urlopen(upstream.url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def test_an_upstream_entry_is_one_model_beside_a_local_one():
    """A `models:` entry with `upstream:` sits beside a GGUF loaded here:
    the model field picks where a request runs, the upstream's own counters
    show which requests reached it, and a stream to it before its first use
    starts with the load's frame, which the client skips."""
    from openai import OpenAI

    upstream = LlamaServer("--jinja", "--metrics")
    entry = json.dumps({"name": "remote", "upstream": upstream.url, "aliases": ["far"]})
    server = RunningServer(["--model", f"near={DEFAULT_MODEL}", "--model-entry", entry, "--no-skills"])
    try:
        with urllib.request.urlopen(server.url + "/v1/models") as response:
            listed = json.loads(response.read())["data"]
        assert [(m["id"], m["status"]) for m in listed] == [("near", "loaded"), ("remote", "unloaded")], listed

        # The first request to it, streamed: the load's comment comes first.
        body = {"model": "far", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4,
                "temperature": 0, "stream": True}
        request = urllib.request.Request(server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            text = response.read().decode()
        assert text.startswith(": loading model 'remote' ("), text[:200]
        assert text.rstrip().endswith("data: [DONE]"), text[-200:]

        client = OpenAI(base_url=server.url + "/v1", api_key="unused")
        ask = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 4, "temperature": 0}
        before = llama_metric(upstream, "llamacpp:prompt_tokens_total")
        near = client.chat.completions.create(model="near", **ask)
        assert near.model == "near"
        assert llama_metric(upstream, "llamacpp:prompt_tokens_total") == before, "a local request reached the upstream"
        remote = client.chat.completions.create(model="remote", **ask)
        assert remote.model == "remote"
        assert remote.usage.completion_tokens > 0
        assert llama_metric(upstream, "llamacpp:prompt_tokens_total") > before, "the upstream never saw the request"
        with urllib.request.urlopen(server.url + "/v1/models") as response:
            listed = json.loads(response.read())["data"]
        assert [(m["id"], m["status"]) for m in listed] == [("near", "loaded"), ("remote", "loaded")], listed
    finally:
        server.stop()
        upstream.stop()
