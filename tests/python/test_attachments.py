"""Attachments through the real clients: the `openai` package uploading to
/v1/files and sending `input_file` (by id and inline) and a Chat Completions
`file` part, the `anthropic` package with a PDF `document` block, the
`ollama` package with `images`; the seed's own case (a PDF made by a real
PDF tool, read in the sandbox by a scripted model's command, and without
code execution by read_file, through the confined PDF reader); the real
model with an attachment; and hostile uploads (a 1 GB upload cut off
halfway, one declared past the limit) that leave nothing behind.

The model's choices come from a scripted upstream, so what a test checks is
what the server sent the model, the same on every host."""

import base64
import io
import json
import socket
import time
from pathlib import Path

import anthropic
import ollama
import openai
import pytest

from conftest import DEFAULT_MODEL
from scripted_upstream import ScriptedUpstream, call, say, text_of

STATEMENT = "Statement total: 1234.56 EUR"


def make_pdf(path):
    """A one-page PDF with STATEMENT on it, made by fpdf2."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=12)
    pdf.cell(text=STATEMENT)
    pdf.output(str(path))
    return path.read_bytes()


def _scripted(start_server, tmp_path, script, *extra):
    upstream = ScriptedUpstream(script)
    server = start_server("--upstream", f"{upstream.url},mode=chat", "--state-dir", str(tmp_path / "state"), *extra)
    return upstream, server


def _user_text(body):
    return "\n".join(text_of(m) for m in body["messages"] if m["role"] == "user")


def test_the_openai_package_uploads_files_and_attaches_them_by_id_and_inline(start_server, tmp_path):
    upstream, server = _scripted(start_server, tmp_path, lambda body: say("Read."))
    try:
        sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        made = sdk.files.create(file=("totals.csv", io.BytesIO(b"item,total\nrent,1200\n")), purpose="user_data")
        assert (made.object, made.filename, made.bytes, made.purpose) == ("file", "totals.csv", 21, "user_data")
        assert [f.id for f in sdk.files.list()] == [made.id]
        assert sdk.files.retrieve(made.id).filename == "totals.csv"
        assert sdk.files.content(made.id).read() == b"item,total\nrent,1200\n"

        pdf = make_pdf(tmp_path / "statement.pdf")
        inline = "data:application/pdf;base64," + base64.b64encode(pdf).decode()
        sdk.responses.create(model="scripted", input=[{"role": "user", "content": [
            {"type": "input_text", "text": "Sum these up."},
            {"type": "input_file", "file_id": made.id},
            {"type": "input_file", "filename": "statement.pdf", "file_data": inline},
        ]}])
        said = _user_text(upstream.requests[-1])
        assert "[Attached file: attachments/totals.csv (text/plain, 21 bytes). Its text:]\nitem,total\nrent,1200" in said
        assert f"[Attached file: attachments/statement.pdf (application/pdf, {len(pdf)} bytes)." in said

        sdk.chat.completions.create(model="scripted", messages=[{"role": "user", "content": [
            {"type": "text", "text": "And this one?"},
            {"type": "file", "file": {"file_id": made.id}},
        ]}])
        assert "attachments/totals.csv (text/plain, 21 bytes)" in _user_text(upstream.requests[-1])

        # A name the server will not take as it is, and a file of someone
        # the caller is not: refused or renamed, with a sentence.
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.responses.create(model="scripted", input=[{"role": "user", "content": [
                {"type": "input_file", "file_id": "file-not-yours"}]}])
        assert "no file of yours has" in refused.value.message
        sdk.responses.create(model="scripted", input=[{"role": "user", "content": [
            {"type": "input_file", "filename": "../../etc/pass\x00wd\x1b[2J", "file_data": base64.b64encode(b"x").decode()}]}])
        assert "[Attached file: attachments/pass_wd__2J (text/plain, 1 bytes)" in _user_text(upstream.requests[-1])

        assert sdk.files.delete(made.id).deleted is True
        with pytest.raises(openai.NotFoundError):
            sdk.files.retrieve(made.id)
    finally:
        upstream.close()


def test_the_anthropic_package_sends_a_pdf_document_and_ollama_an_image(start_server, tmp_path):
    upstream, server = _scripted(start_server, tmp_path, lambda body: say("Read."))
    try:
        pdf = make_pdf(tmp_path / "statement.pdf")
        claude = anthropic.Anthropic(base_url=server.url, api_key="unused")
        claude.messages.create(model="scripted", max_tokens=64, messages=[{"role": "user", "content": [
            {"type": "document", "title": "statement.pdf",
             "source": {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(pdf).decode()}},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Rent: 1200"}},
            {"type": "text", "text": "Summarize the attached statement."},
        ]}])
        said = _user_text(upstream.requests[-1])
        assert said.startswith("Summarize the attached statement.\n\n"), said
        assert f"[Attached file: attachments/statement.pdf (application/pdf, {len(pdf)} bytes)." in said
        assert "[Attached file: attachments/attachment-2.txt (text/plain, 10 bytes). Its text:]\nRent: 1200" in said

        png = base64.b64decode(
            "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
        local = ollama.Client(host=server.url + "/ollama")
        local.chat(model="scripted", messages=[{"role": "user", "content": "What is this?", "images": [png]}])
        said = _user_text(upstream.requests[-1])
        assert f"[Attached image: attachments/attachment-1.png (image/png, {len(png)} bytes). This model cannot see images" in said
    finally:
        upstream.close()


def test_the_seeds_case_a_pdf_is_read_in_the_sandbox_and_answered_from(start_server, tmp_path):
    def script(body):
        results = [m for m in body["messages"] if m["role"] == "tool"]
        if not results:
            return call("shell", {"command": "pdftotext attachments/statement.pdf -"})
        return say("The statement says: " + text_of(results[-1]).strip())

    upstream, server = _scripted(start_server, tmp_path, script, "--code-exec")
    try:
        sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        pdf = make_pdf(tmp_path / "statement.pdf")
        made = sdk.files.create(file=("statement.pdf", pdf), purpose="user_data")
        answer = sdk.responses.create(model="scripted", input=[{"role": "user", "content": [
            {"type": "input_text", "text": "Summarize the attached statement."},
            {"type": "input_file", "file_id": made.id}]}])
        assert STATEMENT in answer.output_text, answer.output_text
    finally:
        upstream.close()


def _reads(path):
    """A scripted model that reads `path` with read_file, then answers with what it read."""
    def script(body):
        results = [m for m in body["messages"] if m["role"] == "tool"]
        if not results:
            return call("read_file", {"path": path})
        return say("It reads: " + text_of(results[-1]).strip())
    return script


def test_without_code_execution_read_file_reads_a_pdfs_text_and_survives_a_bomb(start_server, tmp_path):
    upstream, server = _scripted(start_server, tmp_path, _reads("attachments/statement.pdf"))
    try:
        sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        pdf = make_pdf(tmp_path / "statement.pdf")
        made = sdk.files.create(file=("statement.pdf", pdf), purpose="user_data")
        answer = sdk.responses.create(model="scripted", input=[{"role": "user", "content": [
            {"type": "input_text", "text": "Summarize the attached statement."},
            {"type": "input_file", "file_id": made.id}]}])
        assert STATEMENT in answer.output_text, answer.output_text

        # A stream that inflates to 1 GiB: the confined reader stops at its
        # memory limit, the model is told, and the server goes on.
        import zlib
        data = zlib.compress(b"\0" * (1 << 30), 9)
        bomb = (b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
                b"3 0 obj<</Type/Page/Parent 2 0 R/Contents 4 0 R>>endobj\n"
                b"4 0 obj<</Length " + str(len(data)).encode() + b"/Filter/FlateDecode>>stream\n" + data
                + b"\nendstream endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n")
        inline = "data:application/pdf;base64," + base64.b64encode(bomb).decode()
        answer = sdk.responses.create(model="scripted", input=[{"role": "user", "content": [
            {"type": "input_file", "filename": "statement.pdf", "file_data": inline}]}])
        assert "not text, and its text could not be read" in answer.output_text, answer.output_text
        assert sdk.models.list().data
    finally:
        upstream.close()


def test_on_the_real_model_a_turn_with_an_attachment_completes_and_the_note_is_its_prompt(start_server):
    server = start_server("--model", str(DEFAULT_MODEL), "--no-skills")
    http = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    note_text = "Read this.\n\n[Attached file: attachments/notes.txt (text/plain, 10 bytes). Its text:]\nRent: 1200\n[End of attachments/notes.txt]"
    attached = [{"role": "user", "content": [
        {"type": "input_text", "text": "Read this."},
        {"type": "input_file", "filename": "notes.txt", "file_data": base64.b64encode(b"Rent: 1200").decode()}]}]
    # The prompt with the file counts exactly as the prompt with its line written out.
    count = lambda input: http.responses.input_tokens.count(input=input).input_tokens
    assert count(attached) == count([{"role": "user", "content": note_text}])
    answer = http.responses.create(model="SmolLM2-135M-Instruct.Q4_1", input=attached, max_output_tokens=16, temperature=0)
    assert answer.status in ("completed", "incomplete") and answer.usage.output_tokens > 0


def _spooled(state):
    uploads = Path(state) / "uploads"
    return sorted(p.name for p in uploads.iterdir()) if uploads.exists() else []


def test_an_upload_cut_off_halfway_or_declared_too_large_leaves_nothing(start_server, tmp_path):
    state = tmp_path / "state"
    server = start_server("--model", str(DEFAULT_MODEL), "--no-skills", "--state-dir", str(state))
    host, port = server.url.removeprefix("http://").split(":")
    head = (b"--cut\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nuser_data\r\n"
            b"--cut\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\n\r\n")
    # A 1 GB upload, sent in chunks, whose connection drops after 16 MiB.
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: multipart/form-data; boundary=cut\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"\0" * (1 << 20)
        connection.sendall(b"%x\r\n%s\r\n" % (len(head), head))
        for _ in range(16):
            connection.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    # Declared as 1 GB: refused before a byte of it is read.
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: multipart/form-data; boundary=cut\r\nContent-Length: 1073741824\r\n\r\n" + head)
        answer = connection.recv(65536).decode(errors="replace")
        assert answer.startswith("HTTP/1.1 413"), answer
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    # The server is still there; nothing was kept, and the spooled copy is gone.
    for _ in range(100):
        if not _spooled(state):
            break
        time.sleep(0.05)
    assert list(sdk.files.list()) == []
    assert _spooled(state) == []
