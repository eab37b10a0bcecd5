"""``drvenus serve`` on a scripted model: the run registries of the API and Heavy tests, the
tools' scripted bodies, reading server-sent events, and ``drvenus serve`` as a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from drvenus import protocol
from drvenus.agent import AgentConfig, HeavyPolicy, ResearchAgent
from drvenus.serve.agents import AgentPool
from drvenus.serve.runs import RunRegistry
from scripted import PerQuestionModel, ScriptedTools, answer, call

DRACULA = "https://en.wikipedia.org/wiki/Dracula"
SYNTHESISED = "Bram Stoker, as every run found"  # Heavy mode's synthesised answer
HEAVY_CAP = 4


def script(question: str) -> list[str]:
    """A search, a visit and the answer; ``direct...`` questions are answered at once."""
    if question.startswith("direct"):
        return [answer("42")]
    return [
        call("search", query=["Dracula author"]),
        call("visit", url=[DRACULA], goal="who wrote it"),
        answer("Bram Stoker"),
    ]


def delay(question: str) -> float:
    return 0.6 if question.startswith("slow") else 0.0


def tool_body(tool_call) -> str:
    if tool_call.name == "search":
        hits = [{"title": "Dracula", "url": DRACULA, "snippet": "1897 novel by Bram Stoker"}]
        return protocol.render_search([(q, hits) for q in tool_call.arguments["query"]])
    frames = [
        protocol.render_visit(u, tool_call.arguments["goal"], "Bram Stoker wrote Dracula.",
                              "Dracula is an 1897 Gothic horror novel by Bram Stoker.")
        for u in tool_call.arguments["url"]
    ]
    return protocol.join_visits(frames)


def make_registry(runs_dir: Path, **kwargs) -> RunRegistry:
    agent = ResearchAgent(
        PerQuestionModel(script, delay=delay), ScriptedTools(tool_body),
        AgentConfig(max_steps=5, max_attempts=1, backoff_base=0.0),
    )
    return RunRegistry(AgentPool.fixed(agent, "scripted"), runs_dir, **kwargs)


def heavy_script(question: str) -> list[str]:
    if question.startswith("Question:"):  # the synthesis turn reads the runs' reports
        return [answer(SYNTHESISED)]
    return [
        call("search", query=["Dracula author"]),
        call("visit", url=[DRACULA], goal="who wrote it"),
        answer("Bram Stoker"),
    ]


def heavy_delay(question: str) -> float:
    return 0.5 if question.startswith("slow") else 0.02  # runs interleave


def make_heavy_registry(runs_dir: Path, runs: int = 1, script=heavy_script, delay=heavy_delay,
                        max_steps: int = 5) -> RunRegistry:
    """Heavy mode on a :class:`PerQuestionModel` (by default :func:`heavy_script`)."""
    agent = ResearchAgent(
        PerQuestionModel(script, delay=delay), ScriptedTools(tool_body),
        AgentConfig(max_steps=max_steps, max_attempts=1, backoff_base=0.0,
                    heavy=HeavyPolicy(runs)),
    )
    return RunRegistry(AgentPool.fixed(agent, "scripted", heavy_cap=HEAVY_CAP), runs_dir)


def read_sse(response: httpx.Response, stop_after: int | None = None) -> list[tuple[str, dict]]:
    """(event name, data) of a server-sent event stream (trace events up to ``stop_after``)."""
    out: list[tuple[str, dict]] = []
    name, data = "message", []
    traces = 0
    for line in response.iter_lines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            out.append((name, json.loads("\n".join(data))))
            traces += name == "trace"
            name, data = "message", []
            if stop_after is not None and traces >= stop_after:
                break
    return out


def events_of(client: httpx.Client, run_id: str, after: int | None = None) -> list[dict]:
    headers = {"Last-Event-ID": str(after)} if after is not None else {}
    with client.stream("GET", f"/api/runs/{run_id}/events", headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return [data for name, data in read_sse(r) if name == "trace"]


class Served:
    """``drvenus serve --port 0`` in a subprocess; its URL read from the ready line."""

    def __init__(self, runs_dir: Path, env: dict[str, str], *args: str) -> None:
        self.runs_dir = runs_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "drvenus", "serve", "--port", "0", "--runs-dir", str(runs_dir),
             *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.lines: list[str] = []
        self.url = ""
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line)
                found = re.search(r"serving on (http://\S+?):? ", line)
                if found and not self.url:
                    self.url = found.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(300) or not self.url:
            self.stop()
            raise RuntimeError("drvenus serve did not start:\n" + "".join(self.lines))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
