"""A scripted model behind an OpenAI-compatible chat API on 127.0.0.1.

skillhost drives it as an upstream in chat mode (`--upstream URL,mode=chat`),
so the real server, its loop and every API surface run as they do for a
user; only the model's choices are fixed. A test whose outcome would
otherwise hang on what the small real model writes (a client's whole turn,
say) gets a certain answer here, the same on every host.

The script is a function of the request body that returns the next answer:
`say(text)` or `call(name, arguments)`. Every body the upstream received is
kept in `requests`, so a test can check what the server sent the model
(a tool's result coming back, for one).
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "scripted"


def say(text):
    """An answer of plain text."""
    return {"text": text}


def call(name, arguments):
    """An answer that is one call of the tool `name`."""
    return {"calls": [{"id": f"call_{name}_1", "type": "function",
                       "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def text_of(message):
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def tool_names(body):
    return [tool["function"]["name"] for tool in body.get("tools", []) if tool.get("type") == "function"]


class ScriptedUpstream:
    def __init__(self, script, delay=0.0):
        """`delay` is the seconds between the events of each streamed answer;
        with 0 (the default) a whole answer goes out in one write. A test that
        must act while an answer is still being written (stop it, say) sets
        one, so the answer lasts as long as the test needs."""
        self.script = script
        self.delay = delay
        self.requests = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_):
                pass

            def do_GET(self):
                if self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                if self.path != "/v1/chat/completions":
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                upstream.requests.append(body)
                self._stream(upstream.script(body))

            def _json(self, status, value):
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, answer):
                # One answer as OpenAI's stream: the content a word at a time
                # (or the calls in one piece), the finish, then the usage.
                base = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
                chunks = []
                if "calls" in answer:
                    pieces = [{"index": i, **c} for i, c in enumerate(answer["calls"])]
                    chunks.append({"delta": {"role": "assistant", "tool_calls": pieces}, "finish_reason": None})
                    chunks.append({"delta": {}, "finish_reason": "tool_calls"})
                else:
                    for word in answer["text"].split(" "):
                        piece = word if not chunks else " " + word
                        chunks.append({"delta": {"content": piece}, "finish_reason": None})
                    chunks.append({"delta": {}, "finish_reason": "stop"})
                events = [{**base, "choices": [{"index": 0, **c}]} for c in chunks]
                events.append({**base, "choices": [],
                               "usage": {"prompt_tokens": 100, "completion_tokens": len(chunks),
                                         "total_tokens": 100 + len(chunks)}})
                frames = [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
                encoded = "".join(frames).encode()
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(encoded)))
                self.end_headers()
                if not upstream.delay:
                    self.wfile.write(encoded)
                    return
                try:
                    for frame in frames:
                        self.wfile.write(frame.encode())
                        time.sleep(upstream.delay)
                except (BrokenPipeError, ConnectionResetError):
                    # The server stopped reading (its turn was stopped): the
                    # rest of the answer has no one to go to.
                    self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self):
        self._server.shutdown()
        self._server.server_close()
