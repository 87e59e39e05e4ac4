"""A deployment as other people's clients meet it, against the real binary
and model: keys with the `openai` and `ollama` clients, admission under
overload, uploads that stream instead of filling memory, and log lines that
text from outside cannot forge."""

import concurrent.futures
import os
import zipfile

import httpx
import ollama
import openai
import pytest

from conftest import DEFAULT_MODEL

MODEL = "SmolLM2-135M-Instruct.Q4_1"
USER_KEY = "sk-user-deploy-1"
ADMIN_KEY = "sk-admin-deploy-1"


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.fixture
def keyed_server(start_server, tmp_path):
    return start_server(
        "--model", str(DEFAULT_MODEL), "--api-key", USER_KEY, "--admin-key", ADMIN_KEY,
        "--skills-install-dir", str(tmp_path / "installed"),
    )


def test_the_openai_and_ollama_clients_with_keys(keyed_server):
    url = keyed_server.url
    client = openai.OpenAI(base_url=url + "/v1", api_key=USER_KEY)
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0
    )
    assert answer.choices[0].message.content is not None
    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=url + "/v1", api_key="sk-wrong").models.list()
    assert refused.value.status_code == 401
    assert refused.value.body["code"] == "invalid_api_key"

    ollama_client = ollama.Client(host=url + "/ollama", headers={"Authorization": f"Bearer {USER_KEY}"})
    reply = ollama_client.chat(
        model=MODEL, messages=[{"role": "user", "content": "Say hi."}], options={"num_predict": 4, "temperature": 0}
    )
    assert reply.message.role == "assistant"
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=url + "/ollama").chat(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 401
    assert "needs a key" in refused.value.error

    # x-api-key works too; admin routes want the admin key.
    assert httpx.get(url + "/v1/models", headers={"x-api-key": USER_KEY}).status_code == 200
    rescan = httpx.post(url + "/api/skills/rescan", headers={"Authorization": f"Bearer {USER_KEY}"})
    assert rescan.status_code == 403 and "admin key" in rescan.json()["error"]
    assert httpx.post(url + "/api/skills/rescan", headers={"x-api-key": ADMIN_KEY}).status_code == 200
    # Health stays open for load balancers; keys never reach the log.
    assert httpx.get(url + "/health").status_code == 200
    log = "".join(keyed_server.log)
    assert USER_KEY not in log and ADMIN_KEY not in log and "sk-wrong" not in log


def test_overload_is_refused_with_retry_after_and_counted(start_server):
    server = start_server("--model", str(DEFAULT_MODEL), "--parallel", "1", "--max-queued", "1")
    # Every served answer runs its whole budget, whatever the model writes:
    # how long the places stay held is the test's, not the model's.
    body = {
        "messages": [{"role": "user", "content": "Count from one to forty."}], "max_tokens": 48, "stream": True,
        "temperature": 0, "ignore_eos": True,
    }

    def one(_):
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=300) as response:
            text = "".join(response.iter_text())
            return response.status_code, response.headers.get("retry-after"), text

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    served = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 503]
    assert len(served) + len(refused) == len(results), [r[:2] for r in results]
    # One decoding and one waiting hold the two places while the rest arrive.
    assert len(served) >= 2 and len(refused) >= 1, [r[:2] for r in results]
    assert all("data: [DONE]" in text for _, _, text in served)
    assert all(retry == "2" and "--max-queued" in text for _, retry, text in refused)
    scraped = httpx.get(server.url + "/metrics").text
    assert f'skillhost_refused_requests_total{{reason="overloaded"}} {len(refused)}' in scraped
    assert "skillhost_admitted_requests 0" in scraped


def test_a_250_mb_upload_streams_to_disk(start_server, tmp_path):
    install = tmp_path / "installed"
    server = start_server("--model", str(DEFAULT_MODEL), "--skills-install-dir", str(install))
    archive = tmp_path / "big.zip"
    chunk = os.urandom(1 << 20)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("big/SKILL.md", "---\nname: big\ndescription: A skill with large assets.\n---\nBody.\n")
        for part in range(4):
            with zf.open(f"big/assets/part{part}.bin", "w", force_zip64=True) as entry:
                for _ in range(62):
                    entry.write(chunk)
    assert archive.stat().st_size > 250_000_000
    before = vm_hwm_kib(server.process.pid)
    with open(archive, "rb") as data:
        response = httpx.post(
            server.url + "/api/skills", files={"file": ("big.zip", data, "application/zip")}, timeout=600
        )
    assert response.status_code == 201, response.text
    after = vm_hwm_kib(server.process.pid)
    # The peak resident size moved by a few MB at most, not by the archive.
    assert after - before < 16 * 1024, f"VmHWM grew by {(after - before) / 1024:.1f} MiB during the upload"
    assert (install / "big" / "assets" / "part3.bin").stat().st_size == 62 << 20
    assert not any(p.name.startswith(".upload-") for p in install.iterdir())


def test_text_from_outside_cannot_forge_a_log_line(start_server, tmp_path):
    roots = tmp_path / "roots"
    evil = roots / "evil\nERROR forged line from a folder name"
    evil.mkdir(parents=True)
    (evil / "SKILL.md").write_text("not front matter\nWARN forged line from a skill file\n")
    server = start_server("--model", str(DEFAULT_MODEL), "--skills-dir", str(roots))
    lines = [line for line in server.log if "forged line" in line]
    assert lines, "".join(server.log)
    assert not any(line.startswith(("ERROR forged", "WARN forged")) for line in "".join(server.log).splitlines())
