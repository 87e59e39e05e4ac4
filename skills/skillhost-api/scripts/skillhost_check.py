#!/usr/bin/env python3
"""Report whether a skillhost server is up: health, model and skills.

Usage:
    python3 skillhost_check.py [BASE_URL] [--wait SECONDS] [--timeout SECONDS]

BASE_URL defaults to $SKILLHOST_URL, or http://127.0.0.1:5000 when that is
not set. A trailing /v1 is ignored, so an OpenAI client's base URL works too.

It asks GET /health, GET /v1/models and GET /api/skills and prints what they
say. Exit status:
    0  the server answered and its model is serving
    1  the server answered but is not healthy (for example, still loading)
    3  nothing answered at that address
    2  the command line was wrong

Only the Python 3 standard library is used.
"""

import argparse
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:5000"
EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


class Unreachable(Exception):
    """Nothing answered HTTP at the address."""


def get(base, path, timeout):
    """GETs a path; returns (status, headers, parsed JSON or text)."""
    request = urllib.request.Request(base + path, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, headers, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        status, headers, raw = err.code, err.headers, err.read()
    except (urllib.error.URLError, ConnectionError, socket.timeout, OSError) as err:
        reason = getattr(err, "reason", err)
        raise Unreachable("%s%s did not answer: %s" % (base, path, reason))
    text = raw.decode("utf-8", "replace")
    try:
        return status, headers, json.loads(text)
    except ValueError:
        return status, headers, text


def plural(count, word):
    return "%s %s%s" % (count, word, "" if count == 1 else "s")


def error_message(body):
    """The sentence from either error shape skillhost uses."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error is not None:
            return str(error)
    return str(body).strip() or "no details"


def check_health(base, timeout, wait):
    """Polls /health until it is 200 or `wait` seconds pass; returns (ok, line)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            status, headers, body = get(base, "/health", timeout)
        except Unreachable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(1)
            continue
        if status == 200:
            return True, "ok"
        if time.monotonic() >= deadline:
            line = "HTTP %d: %s" % (status, error_message(body))
            retry = headers.get("Retry-After") if headers else None
            if retry:
                line += " (the server suggests retrying after %s s)" % retry
            return False, line
        delay = 1.0
        try:
            delay = max(0.2, min(float(headers.get("Retry-After", 1)), 5.0))
        except (TypeError, ValueError):
            pass
        time.sleep(delay)


def describe_model(base, timeout):
    status, _, body = get(base, "/v1/models", timeout)
    if status != 200:
        return False, "HTTP %d: %s" % (status, error_message(body))
    try:
        model = body["data"][0]
    except (KeyError, IndexError, TypeError):
        return False, "the answer lists no model"
    meta = model.get("meta") or {}
    parts = ["context %s tokens" % model.get("context_length", "unknown")]
    if isinstance(meta.get("parallel"), int):
        parts.append(plural(meta["parallel"], "parallel slot"))
    if meta.get("architecture"):
        parts.append("architecture %s" % meta["architecture"])
    return True, "%s (%s)" % (model.get("id", "unnamed"), ", ".join(parts))


def describe_skills(base, timeout):
    """Returns the lines about skills."""
    status, _, body = get(base, "/api/skills", timeout)
    if status != 200 or not isinstance(body, dict):
        return ["skills:  HTTP %d: %s" % (status, error_message(body))]
    if not body.get("enabled", True):
        return ["skills:  turned off on this server (--no-skills)"]
    skills = body.get("skills") or []
    errors = body.get("errors") or []
    uploads = "uploads allowed" if body.get("installable") else "uploads off"
    lines = ["skills:  %d loaded, %s, %s" % (len(skills), plural(len(errors), "load error"), uploads)]
    for skill in skills:
        files = plural(len(skill.get("files") or []), "file")
        lines.append("  %s (%s, %s)" % (skill.get("id"), skill.get("origin"), files))
        for warning in skill.get("warnings") or []:
            lines.append("    warning: %s" % warning)
    for error in errors:
        lines.append("  load error: %s: %s" % (error.get("path"), error.get("message")))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description="Check a running skillhost server: health, model and skills.")
    parser.add_argument("base_url", nargs="?", default=os.environ.get("SKILLHOST_URL", DEFAULT_URL),
                        help="server address (default: $SKILLHOST_URL or %s)" % DEFAULT_URL)
    parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="keep retrying this long while the server is unreachable or loading (default: 0)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="timeout of each HTTP request (default: 10)")
    args = parser.parse_args(argv)

    base = args.base_url.strip().rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    if "://" not in base:
        base = "http://" + base
    print("server:  %s" % base)
    try:
        healthy, line = check_health(base, args.timeout, args.wait)
        print("health:  %s" % line)
        if not healthy:
            return EXIT_UNHEALTHY
        model_ok, line = describe_model(base, args.timeout)
        print("model:   %s" % line)
        for line in describe_skills(base, args.timeout):
            print(line)
    except Unreachable as err:
        print("health:  unreachable: %s" % err)
        return EXIT_UNREACHABLE
    return EXIT_OK if model_ok else EXIT_UNHEALTHY


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        # The reader (head, grep -q) stopped early; that is not a failure here.
        sys.stderr.close()
        sys.exit(EXIT_OK)
