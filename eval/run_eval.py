#!/usr/bin/env python3
"""Graded end-to-end check of skills: does the model answer better with them?

Usage:
    python eval/run_eval.py [--model PATH] [--server URL] [--max-tokens N] [--repeat K]

Every task in eval/tasks.json is asked in three arms (see eval/README.md):
control (no skills at all), selected (only the skill the task needs) and
discovery (only the catalog of every registered skill). Every task in
eval/code_tasks.json is asked on two more servers with --code-exec: without
an install grant, and with host-run installs from a package index served on
127.0.0.1; rounds, and rounds spent after a failed tool call, are reported. The answers are graded by regular expressions,
a table is printed and a JSON report is written to
eval/results/<model-stem>.json.

Without --server the script starts target/release/skillhost itself with
--skills-dir eval/skills and stops it at the end. With --server it uses a
running server, which must have the eval skills registered.

Low scores still exit 0: this is a measurement, not a test. The exit status
is 1 when the server cannot be started or a request fails.
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
EVAL_DIR = ROOT / "eval"
SKILLS_DIR = EVAL_DIR / "skills"
RESULTS_DIR = EVAL_DIR / "results"
# CI may keep cargo's output outside the clone.
BINARY = ROOT / os.environ.get("CARGO_TARGET_DIR", "target") / "release" / "skillhost"
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# Loading a model on a busy 2-core machine can be slow.
START_TIMEOUT_S = 300
# One request may run several generation rounds on a slow CPU.
REQUEST_TIMEOUT_S = 900
ARMS = ("control", "selected", "discovery")
CODE_ARMS = ("no-install", "install")
sys.path.insert(0, str(ROOT / "tests" / "python"))
import local_index  # noqa: E402  (the install tests' package index)


class EvalError(Exception):
    """The evaluation could not be carried out (as opposed to a low score)."""


class Server:
    """The skillhost binary, started on a free port with the eval skills."""

    def __init__(self, model, extra=()):
        if not BINARY.exists():
            raise EvalError(f"{BINARY} is missing: run `make build` first")
        if not model.exists():
            raise EvalError(f"the model {model} does not exist")
        self.install_dir = tempfile.TemporaryDirectory(prefix="skillhost-eval-")
        self.log = []
        self.url = None
        self._listening = threading.Event()
        command = [
            str(BINARY), "serve", "--host", "127.0.0.1", "--port", "0",
            "--model", str(model), "--ctx-size", "8192", "--parallel", "1",
            "--skills-dir", str(SKILLS_DIR), "--skills-install-dir", self.install_dir.name, *extra,
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "RUST_LOG": "info,llama-cpp-2=warn"},
        )
        threading.Thread(target=self._read_log, daemon=True).start()
        try:
            self._wait_until_ready()
        except EvalError:
            self.stop()
            raise

    def _read_log(self):
        for line in self.process.stderr:
            self.log.append(line)
            match = re.search(r"listening on (http://\S+)", line)
            if match and self.url is None:
                self.url = match.group(1)
                self._listening.set()

    def _wait_until_ready(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._listening.wait(0.2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise EvalError("the server did not start listening:\n" + self.log_tail())
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EvalError("the server exited:\n" + self.log_tail())
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise EvalError("the server never became healthy:\n" + self.log_tail())

    def log_tail(self, lines=30):
        # llama.cpp's own INFO lines would crowd out skillhost's.
        return "".join([line for line in self.log if " INFO llama-cpp-2" not in line][-lines:])

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.install_dir.cleanup()


def arm_fields(arm, task, all_skills):
    """The skillhost-specific request fields for one arm."""
    if arm == "control":
        return {"skills_discovery": False}
    if arm == "selected":
        # The negative control needs no skill, so it gets all of them: the
        # hardest case for keeping skill content out of an unrelated answer.
        return {"skills": [task["skill"]] if task["skill"] else all_skills, "skills_discovery": False}
    return {"skills": [], "skills_discovery": True}


def grade(task, answer):
    """Which required patterns are missing and which forbidden ones matched."""
    missing = [p for p in task.get("require", []) if not re.search(p, answer, re.IGNORECASE)]
    leaked = [p for p in task.get("forbid", []) if re.search(p, answer, re.IGNORECASE)]
    return {"pass": not missing and not leaked, "missing": missing, "leaked": leaked}


def ask(client, url, model_id, task, arm, fields, max_tokens):
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": task["prompt"]}],
        "temperature": 0,
        "max_tokens": max_tokens,
        **fields,
    }
    started = time.monotonic()
    try:
        response = client.post(url + "/v1/chat/completions", json=body)
    except httpx.HTTPError as error:
        raise EvalError(f"{task['id']} ({arm}): the request failed: {error!r}") from error
    if response.status_code != 200:
        raise EvalError(f"{task['id']} ({arm}): HTTP {response.status_code}: {response.text[:500]}")
    try:
        data = response.json()
        choice = data["choices"][0]
        answer = choice["message"].get("content") or ""
    except (ValueError, KeyError, IndexError) as error:
        raise EvalError(f"{task['id']} ({arm}): not a chat completion: {response.text[:500]}") from error
    return {
        "task": task["id"],
        "arm": arm,
        "request": fields,
        "prompt": task["prompt"],
        "answer": answer,
        "finish_reason": choice.get("finish_reason"),
        "rounds": len(data.get("rounds") or []),
        "seconds": round(time.monotonic() - started, 1),
        "verdict": grade(task, answer),
    }


def check_skills_registered(url, needed):
    listing = httpx.get(url + "/api/skills", timeout=30).json()
    registered = {skill["id"] for skill in listing.get("skills", [])}
    missing = sorted(set(needed) - registered)
    if missing:
        raise EvalError(f"the server at {url} lacks the eval skills {missing}; start it with --skills-dir eval/skills")


def summarize(results, tasks, negative, repeat):
    """The printed table as lines, and the same numbers for the report."""
    lines, summary = [f"{'arm':<10} {'score':<7} tasks"], {}
    for arm in ARMS:
        per_task = {t["id"]: sum(r["verdict"]["pass"] for r in results if r["arm"] == arm and r["task"] == t["id"])
                    for t in tasks}
        score, total = sum(per_task.values()), len(tasks) * repeat
        summary[arm] = {"score": score, "total": total, "tasks": per_task}
        marks = " ".join(f"{task_id}:{passed}/{repeat}" for task_id, passed in per_task.items())
        lines.append(f"{arm:<10} {f'{score}/{total}':<7} {marks}")
    verdicts = []
    for arm in ARMS:
        runs = [r for r in results if r["arm"] == arm and r["task"] == negative["id"]]
        reasons = []
        if any(r["verdict"]["missing"] for r in runs):
            reasons.append("wrong answer")
        if any(r["verdict"]["leaked"] for r in runs):
            reasons.append("leak")
        summary[f"negative_{arm}"] = "pass" if not reasons else "fail (" + ", ".join(reasons) + ")"
        verdicts.append(f"{arm} {summary[f'negative_{arm}']}")
    lines.append("negative control: " + ", ".join(verdicts))
    return lines, summary


class CodeServer:
    """A server for a code arm: --code-exec, and with `install` host-run
    installs from a package index of tests/packages on 127.0.0.1."""

    def __init__(self, model, index, install):
        # Workspaces must be reachable by the sandbox's users.
        self.work = tempfile.TemporaryDirectory(prefix="skillhost-eval-work-")
        os.chmod(self.work.name, 0o755)
        grant = ["--code-exec-allow-install", "--code-exec-install-index", index.url + "/simple"] if install else []
        try:
            self.server = Server(model, ["--code-exec", "--workspace-dir", self.work.name, *grant])
        except EvalError:
            self.work.cleanup()
            raise
        self.url = self.server.url

    def close(self):
        self.server.stop()
        self.work.cleanup()


def code_arm(client, server, model_id, task, arm, max_tokens):
    """One code task: the answer, and from the server's log what its tool
    calls did (failed calls are the rounds spent on recoveries)."""
    before = len(server.server.log)
    result = ask(client, server.url, model_id, task, arm, {"skills_discovery": False}, max_tokens)
    log = server.server.log[before:]
    result["failed_calls"] = sum('tool answered' in line and "ok=false" in line for line in log)
    result["host_installs"] = sum("host-run install" in line and "ok=true" in line for line in log)
    return result


def code_summary(results, tasks, repeat):
    lines, summary = [f"{'code arm':<10} {'score':<7} tasks"], {}
    for arm in CODE_ARMS:
        runs = [r for r in results if r["arm"] == arm]
        per_task = {t["id"]: sum(r["verdict"]["pass"] for r in runs if r["task"] == t["id"]) for t in tasks}
        score, total = sum(per_task.values()), len(tasks) * repeat
        rounds = sum(r["rounds"] for r in runs)
        recovering = sum(r["failed_calls"] for r in runs)
        installs = sum(r["host_installs"] for r in runs)
        summary[arm] = {"score": score, "total": total, "tasks": per_task, "rounds": rounds,
                        "rounds_after_failures": recovering, "host_installs": installs}
        marks = " ".join(f"{task_id}:{passed}/{repeat}" for task_id, passed in per_task.items())
        lines.append(f"{arm:<10} {f'{score}/{total}':<7} {marks}  "
                     f"({rounds} rounds, {recovering} after a failed call, {installs} host-run installs)")
    return lines, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, help=f"GGUF model to serve (default: {DEFAULT_MODEL.relative_to(ROOT)})")
    parser.add_argument("--server", help="URL of a running skillhost with the eval skills, e.g. http://127.0.0.1:5000")
    parser.add_argument("--max-tokens", type=int, default=256, help="max_tokens per request (default: 256)")
    parser.add_argument("--repeat", type=int, default=1, help="times each task is asked in each arm (default: 1)")
    parser.add_argument("--no-code", action="store_true", help="skip the code arms (eval/code_tasks.json)")
    args = parser.parse_args()
    if args.repeat < 1 or args.max_tokens < 1:
        parser.error("--repeat and --max-tokens must be at least 1")

    spec = json.loads((EVAL_DIR / "tasks.json").read_text())
    code_tasks = json.loads((EVAL_DIR / "code_tasks.json").read_text())["tasks"]
    # The code arm needs a server of its own, which only this script starts.
    run_code = not args.no_code and not args.server
    code_results, code_servers, packages, index = [], [], None, None
    tasks, negative = spec["tasks"], spec["negative_control"]
    all_skills = sorted({t["skill"] for t in tasks})

    server = None
    try:
        if args.server:
            url = args.server.rstrip("/")
        else:
            model = (args.model or DEFAULT_MODEL).resolve()
            print(f"starting skillhost on {model.name} ...", file=sys.stderr)
            server = Server(model)
            url = server.url
        check_skills_registered(url, all_skills)
        model_id = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        label = args.model.name if args.model else (DEFAULT_MODEL.name if server else model_id)

        results = []
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            for task in [*tasks, negative]:
                for arm in ARMS:
                    for _ in range(args.repeat):
                        result = ask(client, url, model_id, task, arm, arm_fields(arm, task, all_skills),
                                     args.max_tokens)
                        results.append(result)
                        verdict = "pass" if result["verdict"]["pass"] else "fail"
                        print(f"  {task['id']:<18} {arm:<10} {verdict}  ({result['rounds']} rounds, "
                              f"{result['seconds']}s)", file=sys.stderr)
            if run_code:
                print("starting the code arms' servers ...", file=sys.stderr)
                model = (args.model or DEFAULT_MODEL).resolve()
                packages = tempfile.TemporaryDirectory(prefix="skillhost-eval-index-")
                index = local_index.publish(Path(packages.name), "skillhost-probe", "skillhost-extra")
                for arm in CODE_ARMS:
                    code_servers.append((arm, CodeServer(model, index, install=arm == "install")))
                for task in code_tasks:
                    for arm, code_server in code_servers:
                        for _ in range(args.repeat):
                            result = code_arm(client, code_server, model_id, task, arm, args.max_tokens)
                            code_results.append(result)
                            verdict = "pass" if result["verdict"]["pass"] else "fail"
                            print(f"  {task['id']:<18} {arm:<10} {verdict}  ({result['rounds']} rounds, "
                                  f"{result['failed_calls']} failed calls, {result['seconds']}s)", file=sys.stderr)
    except (EvalError, httpx.HTTPError) as error:
        if isinstance(error, httpx.HTTPError):
            error = f"cannot reach the server: {error!r}"
        print(f"error: {error}", file=sys.stderr)
        if server:
            time.sleep(1)  # let a crashing server finish exiting
            state = "still running" if server.process.poll() is None else f"exited with {server.process.returncode}"
            print(f"the server is {state}; its last log lines:\n{server.log_tail()}", file=sys.stderr)
        return 1
    finally:
        if server:
            server.stop()
        for _, code_server in code_servers:
            code_server.close()
        if index:
            index.close()
        if packages:
            packages.cleanup()

    lines, summary = summarize(results, tasks, negative, args.repeat)
    if run_code:
        code_lines, summary["code"] = code_summary(code_results, code_tasks, args.repeat)
        lines += code_lines
    print(f"model: {label}")
    print("\n".join(lines))

    RESULTS_DIR.mkdir(exist_ok=True)
    report_path = RESULTS_DIR / f"{label.removesuffix('.gguf')}.json"
    report = {
        "model": label,
        "server": args.server or "started by run_eval.py",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "max_tokens": args.max_tokens,
        "repeat": args.repeat,
        "summary": summary,
        "results": results,
        "code_results": code_results,
    }
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {report_path.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
