"""DR-Venus's own functions, loaded for comparison from its pinned files (hash checked through
the reference store, as drvenus.reference reads them): nothing of DR-Venus is in the repository.
The tests that use them are marked ``NEEDS_REFERENCE`` (helpers.reference: they skip, with how
to get the files, where the real files cannot be had; CI makes that a failure)."""

from __future__ import annotations

import ast
import json
import re
from types import SimpleNamespace
from typing import Any

import json5

from helpers.reference import NEEDS_REFERENCE, real_store

__all__ = ["NEEDS_REFERENCE", "dispatcher", "rl_functions", "run_demo_functions",
           "search_function"]


def pinned_source(path: str) -> str:
    return real_store().read_bytes("DR-Venus", path).decode("utf-8")


def load_functions(source: str, names: set[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """The top-level assignments and functions of ``source`` called ``names`` (methods of its
    classes too, decorators dropped), executed in ``namespace``."""
    body: list[ast.stmt] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in names:
            node.decorator_list = []
            body.append(node)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in names for t in node.targets):
            body.append(node)
    found = {n.targets[0].id if isinstance(n, ast.Assign) else n.name  # type: ignore
             for n in body}
    assert found == names, f"not found in the pinned file: {names - found}"
    body.sort(key=lambda n: isinstance(n, ast.FunctionDef))  # constants and classes first
    module = ast.Module(body=body, type_ignores=[])
    exec(compile(module, "<pinned DR-Venus>", "exec"), namespace)  # noqa: S102 - test only
    return namespace


def run_demo_functions() -> SimpleNamespace:
    """``_sanitize_content``, ``parse_llm_response`` (bound to a quiet solver) and
    ``_tool_call_key`` of Inference/run_demo.py."""
    ns = load_functions(
        pinned_source("Inference/run_demo.py"),
        {"ALLOWED_ARGS", "ALLOWED_TOOLS", "_filter_args", "_sanitize_content",
         "parse_llm_response", "_tool_call_key"},
        {"re": re, "json": json, "json5": json5})
    solver = SimpleNamespace(log=lambda message: None)
    return SimpleNamespace(
        sanitize=ns["_sanitize_content"],
        parse=lambda content: ns["parse_llm_response"](solver, content, 0),
        key=ns["_tool_call_key"])


class _SerperConnection:
    """``http.client.HTTPSConnection`` for DR-Venus's search tool: answers ``reply``."""

    reply: Any = None

    def __init__(self, host: str) -> None:
        self.host = host

    def request(self, *args: Any) -> None:
        pass

    def getresponse(self) -> Any:
        body = json.dumps(type(self).reply).encode("utf-8")
        return SimpleNamespace(read=lambda: body)


def search_function() -> Any:
    """DR-Venus's ``google_search_with_serp`` (Inference/tool_server/tool_search.py) as
    ``search(query, serper_reply) -> text``, Serper answered by ``serper_reply``."""
    http = SimpleNamespace(client=SimpleNamespace(HTTPSConnection=_SerperConnection))
    ns = load_functions(pinned_source("Inference/tool_server/tool_search.py"),
                        {"google_search_with_serp"},
                        {"json": json, "http": http, "SERPER_KEY": "key"})

    def search(query: str, reply: Any) -> str:
        _SerperConnection.reply = reply
        return ns["google_search_with_serp"](None, query)

    return search


class _Replies:
    """``http.client.HTTPSConnection`` for DR-Venus's search tool: answers each query (the
    ``q`` of the request body) from ``replies``."""

    replies: dict[str, Any] = {}

    def __init__(self, host: str) -> None:
        self.host = host
        self.query = ""

    def request(self, method: str, path: str, body: str, headers: Any) -> None:
        self.query = json.loads(body)["q"]

    def getresponse(self) -> Any:
        data = json.dumps(type(self).replies[self.query]).encode("utf-8")
        return SimpleNamespace(read=lambda: data)


class _BaseTool:
    def __init__(self, cfg: Any = None) -> None:
        self.cfg = cfg


def dispatcher(part: str = "Inference") -> Any:
    """DR-Venus's tool dispatcher (``custom_call_tool`` of ``<part>/tool_server/
    execute_tools.py``, its real ``parse_search_results``) over its real search tool
    (``Search`` of tool_search.py), Serper stubbed: ``dispatch(tool_call, replies) -> text``,
    ``replies`` mapping each query to Serper's JSON reply. What DR-Venus's model reads."""
    import typing

    http = SimpleNamespace(client=SimpleNamespace(HTTPSConnection=_Replies))
    tool = load_functions(
        pinned_source(f"{part}/tool_server/tool_search.py"), {"Search"},
        {"json": json, "http": http, "SERPER_KEY": "key", "BaseTool": _BaseTool,
         "print": lambda *a, **k: None, **{n: getattr(typing, n) for n in typing.__all__}})
    route = load_functions(
        pinned_source(f"{part}/tool_server/execute_tools.py"),
        {"parse_search_results", "custom_call_tool"},
        {"re": re, "json": json, "Search": tool["Search"], "Visit": None})

    def dispatch(tool_call: dict, replies: dict[str, Any]) -> str:
        _Replies.replies = replies
        return route["custom_call_tool"](json.loads(json.dumps(tool_call)))

    return dispatch


def rl_functions() -> SimpleNamespace:
    """DR-Venus's RL turn reading (``_parse_single_response``, ``_tool_call_key`` of
    dr_agent_loop.py) and its tool server's answer to a call (``custom_call_tool`` routing to
    the search and visit tools' ``call``, the search text re-read by its real
    ``parse_search_results``; a call that would reach the web answers None)."""
    loop = load_functions(
        pinned_source("RL/scrl/llm_agent/dr_agent_loop.py"),
        {"ALLOWED_ARGS", "THINK_RE", "ANSWER_RE", "TOOL_RE", "_Flag", "_filter_args",
         "_tool_call_key", "_parse_single_response"},
        {"re": re, "json": json, "json5": json5, "Tuple": tuple, "Any": Any})
    reached: list[str] = []
    tools = {}
    for name, path, web in (("Search", "RL/tool_server/tool_search.py", "search_with_serp"),
                            ("Visit", "RL/tool_server/tool_visit.py", "readpage_jina")):
        ns = load_functions(pinned_source(path), {"call"},
                            {"List": list, "Union": Any, "time": __import__("time"),
                             "os": SimpleNamespace(makedirs=lambda *a, **k: None)})
        tools[name] = type(name, (), {"call": ns["call"],
                                      web: lambda self, *a, w=web: reached.append(w) or w})
    route = load_functions(pinned_source("RL/tool_server/execute_tools.py"),
                           {"custom_call_tool", "parse_search_results"},
                           {**tools, "re": re, "json": json})

    def call_tool(tool_call: dict) -> str | None:
        reached.clear()
        text = route["custom_call_tool"](json.loads(json.dumps(tool_call)))
        return None if reached else text

    flags = {loop["_Flag"].END: "answer", loop["_Flag"].CALL: "tool_call",
             loop["_Flag"].ERROR: "malformed"}
    return SimpleNamespace(
        parse=lambda content: loop["_parse_single_response"](content, think=False),
        kind=flags, key=loop["_tool_call_key"], call_tool=call_tool)
