"""What the web page, ``/v1`` and MCP show of a run: trace events made easy to display.

The browser never parses the protocol: every event it gets carries a ``view`` built here with
:mod:`drvenus.protocol` (the thinking of a turn, the hits of a search, the evidence of a visit).
What a client sees never names the model server's address (the operator's console and the run
files do): errors say "the model server". Heavy mode's events keep their run: ``run`` (0..N-1)
on each event a client gets, ``[run i]`` before each progress line; the final answer's events
have none (its ``started`` view has ``heavy``: N and ``heavy_mode``).
Saved files are read here too: trace JSONL (``drvenus ask --trace``, the server's own run
files) and result records with messages (``drvenus run``, ``drvenus eval``, ``ask --json``),
whose events are rebuilt from the conversation.
The protocol's fixed words (the loop's notices, a visit's failure frame) are read in the words
of the profiles handed in (``texts``: the server's profile, and drvenus's for saved files),
never from a table that depends on what else ran in the process.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from drvenus import protocol
from drvenus.agent import TraceEvent
from drvenus.agent.events import split_researches
from drvenus.agent.words import (
    FORCED_NOTE,
    error_words,
    is_forced,
    no_answer_reason,
    no_answer_text,
    termination_words,
)
from drvenus.llm.openai_compat import without_address
from drvenus.net.server import MAX_JSON_DEPTH, json_problem
from drvenus.protocol import DRVENUS_TEXTS, TextsLike
from drvenus.records import parse_json_text
from drvenus.serve.markdown import to_html
from drvenus.text import headline, one_line

EventDict = dict[str, Any]
MAX_SNIPPET = 400
MAX_EVIDENCE = 4000
HEAVY_HOW = {"synthesis": "synthesised", "vote": "by vote"}  # else: stopped before either


def _clip(text: str | None, n: int) -> str:
    text = text or ""
    return text if len(text) <= n else text[: n - 1] + "…"


# --------------------------------------------------------------------------- one event's view


def describe(event: Mapping[str, Any], texts: TextsLike = DRVENUS_TEXTS) -> dict[str, Any]:
    """The display fields of one event dict (``type``, ``step``, ``data``); ``texts``: whose
    fixed words the run used (a visit's failure frame)."""
    kind, data = event.get("type"), event.get("data") or {}
    if kind == "started":
        return {
            "question": data.get("question", ""),
            "model": _public(data.get("model")),
            "max_steps": data.get("max_steps"),
            "max_context_tokens": data.get("max_context_tokens"),
            "heavy": data.get("heavy"),
            "heavy_mode": data.get("heavy_mode"),
        }
    if kind == "step_started":
        return {"context_tokens": data.get("context_tokens")}
    if kind == "model_output":
        return _model_output_view(data)
    if kind == "tool_call":
        return _tool_call_view(data.get("name", ""), data.get("arguments") or {})
    if kind == "tool_result":
        return tool_result_view(data.get("name", ""), str(data.get("content", "")), texts)
    if kind in ("format_error", "limit_notice"):
        body = protocol.unwrap_tool_response((data.get("message") or {}).get("content", ""))
        return {"notice": body or "", "reason": data.get("reason")}
    if kind == "answer":
        return {"answer": data.get("answer") or "", "forced": bool(data.get("forced"))}
    if kind == "compaction":
        return {
            "strategy": data.get("strategy"),
            "tokens_before": data.get("tokens_before"),
            "tokens_after": data.get("tokens_after"),
            "elided": len(data.get("elided") or []),
            "dropped": data.get("dropped") or 0,
            "report": data.get("report"),
        }
    if kind == "error":
        return {
            "kind": data.get("kind", "error"),
            "message": _clip(_public(data.get("message")) or "", 600),
            "attempt": data.get("attempt"),
            "last": bool(data.get("last")),
        }
    if kind == "finished":
        return finished_view(data.get("record") or {}, texts)
    return {}


def _model_output_view(data: Mapping[str, Any]) -> dict[str, Any]:
    text = str(data.get("text") or "")
    parsed = protocol.parse_turn(text)
    return {
        "thinking": parsed.thinking,
        "kind": data.get("kind") or parsed.kind,
        "error": data.get("error"),
        "completion_tokens": data.get("completion_tokens"),
        "prompt_tokens": data.get("prompt_tokens"),
    }


def _strings(value: Any) -> list[str]:
    """A list argument's items as text (a lone string is one item; anything else none)."""
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, list) else []


def _tool_call_view(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    if name == protocol.SEARCH:
        return {"name": name, "queries": _strings(arguments.get("query"))}
    return {
        "name": name,
        "urls": _strings(arguments.get("url")),
        "goal": str(arguments.get("goal") or ""),
    }


def tool_result_view(name: str, body: str, texts: TextsLike = DRVENUS_TEXTS) -> dict[str, Any]:
    """Search hits or visited pages of a tool response body (else its text, e.g. an error);
    a page is ``failed`` when its frame is a failure frame in ``texts``' words."""
    searched = protocol.parse_search_body(body) if name == protocol.SEARCH else None
    if searched is not None:
        return {
            "name": name,
            "results": [
                {
                    "query": entry["query"],
                    "hits": [
                        {
                            "title": hit.get("title", ""),
                            "url": hit.get("url", ""),
                            "snippet": _clip(hit.get("snippet", ""), MAX_SNIPPET),
                        }
                        for hit in entry["web_page_info_list"]
                    ],
                }
                for entry in searched
            ],
        }
    frames = protocol.parse_visit_body(body) if name == protocol.VISIT else None
    if frames is not None:
        return {
            "name": name,
            "pages": [
                {
                    "url": frame["url"],
                    "goal": frame["goal"],
                    "evidence": _clip(frame["evidence"], MAX_EVIDENCE),
                    "summary": _clip(frame["summary"], MAX_EVIDENCE),
                    "failed": protocol.is_visit_failure(frame["summary"], texts),
                }
                for frame in frames
            ],
        }
    return {"name": name, "text": _clip(body, 2000)}


def visited_sources(messages: Iterable[Mapping[str, Any]], texts: TextsLike = DRVENUS_TEXTS
                    ) -> list[str]:
    """The URLs a conversation's visits actually read (failed pages, in ``texts``' words, left
    out), in order."""
    seen: list[str] = []
    for message in messages:
        if message.get("role") != "user":
            continue
        body = protocol.unwrap_tool_response(str(message.get("content", "")))
        frames = protocol.parse_visit_body(body) if body is not None else None
        for frame in frames or []:
            url = frame["url"] or ""
            failed = protocol.is_visit_failure(frame["summary"], texts)
            if not failed and url and url not in seen:
                seen.append(url)
    return seen


def source_titles(messages: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The title the conversation's searches gave each URL (the first one met)."""
    titles: dict[str, str] = {}
    for message in messages:
        if message.get("role") != "user":
            continue
        body = protocol.unwrap_tool_response(str(message.get("content", "")))
        for entry in (protocol.parse_search_body(body) if body is not None else None) or []:
            for hit in entry["web_page_info_list"]:
                url, title = str(hit.get("url") or ""), one_line(hit.get("title") or "", 200)
                if url and title:
                    titles.setdefault(url, title)
    return titles


_OWN_SOURCES = re.compile(r"^\s*(?:#{1,6}\s*)?(?:\*\*|__)?(?:sources|references)(?:\*\*|__)?"
                          r"\s*:?\s*(?:\*\*|__)?\s*$", re.I | re.M)


def lists_sources(answer: str) -> bool:
    """Whether an answer has its own list of sources (a "Sources" or "References" heading)."""
    return bool(_OWN_SOURCES.search(answer or ""))


def sources_markdown(pages: Iterable[Mapping[str, str]]) -> str:
    """``- [Title](url)`` lines (a bare URL where no title is known)."""
    lines = []
    for page in pages:
        title = page.get("title", "").replace("[", "(").replace("]", ")")
        url = page["url"].replace(" ", "%20").replace(")", "%29")
        lines.append(f"- [{title}]({url})" if title else f"- {page['url']}")
    return "\n".join(lines)


def heavy_runs(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The records of Heavy mode's runs that a result record keeps (``extra.heavy.runs``)."""
    extra = record.get("extra")
    heavy = extra.get("heavy") if isinstance(extra, Mapping) else None
    runs = heavy.get("runs") if isinstance(heavy, Mapping) else None
    return [r for r in runs if isinstance(r, Mapping)] if isinstance(runs, list) else []


def finished_view(record: Mapping[str, Any], texts: TextsLike = DRVENUS_TEXTS) -> dict[str, Any]:
    """What a result record shows; a Heavy record's ``sources`` are those its runs read, and
    ``heavy`` says how many runs there were and what chose the answer."""
    termination = str(record.get("termination", ""))
    runs = heavy_runs(record)
    messages = [m for r in [record, *runs] for m in (r.get("messages") or [])
                if isinstance(m, Mapping)]
    heavy = (record.get("extra") or {}).get("heavy") if runs else None
    answered = termination.startswith("answered")
    sources = visited_sources(messages, texts)
    titles = source_titles(messages)
    chosen_by = heavy.get("chosen_by") if heavy else None
    return {
        "termination": termination,
        "answered": answered,
        "prediction": record.get("prediction", ""),
        "headline": headline(str(record.get("prediction") or "")) if answered else "",
        "error": _public(record.get("error")),
        "tool_call_count": record.get("tool_call_count", 0),
        "turns": record.get("turns", 0),
        "final_token_count": record.get("final_token_count", 0),
        "tokens_used": tokens_used(record),
        "elapsed_seconds": record.get("elapsed_seconds", 0.0),
        "usage": record.get("usage") or {},
        "sources": sources,
        "source_pages": [{"url": url, "title": titles.get(url, "")} for url in sources],
        "heavy": {"runs": len(runs), "chosen_by": chosen_by,
                  "how": HEAVY_HOW.get(str(chosen_by), "stopped before an answer was chosen")}
        if heavy else None,
    }


def tokens_used(record: Mapping[str, Any]) -> int:
    """The tokens a run's model calls read and wrote in all (its usage), where
    ``final_token_count`` is only the size of its context at the end."""
    usage = record.get("usage")
    if not isinstance(usage, Mapping):
        return 0
    return sum(int(usage.get(k) or 0) for k in ("prompt_tokens", "completion_tokens")
               if isinstance(usage.get(k), int | float))


def _public(text: Any) -> Any:
    """An error text (or a model's name, which is its server until it is known) as clients
    may see it: without the model server's address."""
    return without_address(text) if isinstance(text, str) else text


def for_client(index: int, event: Mapping[str, Any], texts: TextsLike = DRVENUS_TEXTS) -> EventDict:
    """The event as the browser gets it: its index, type, step, time and view (the bulky raw
    data, e.g. the system prompt and the record's messages, stays on disk), the Markdown of
    the thinking and the answer rendered as sanitised HTML (``html``)."""
    view = describe(event, texts)
    markdown = _markdown_of(event.get("type"), view)
    if markdown:
        view["html"] = to_html(markdown)
    return {
        "i": index,
        "type": event.get("type"),
        "step": event.get("step", 0),
        "time": event.get("time"),
        "run": _run_of(event),
        "view": view,
    }


def _run_of(event: Mapping[str, Any]) -> int | None:
    """The index of the Heavy-mode run an event belongs to (None: a plain run, or the final
    answer of a Heavy one)."""
    tag = (event.get("data") or {}).get("heavy_run")
    return tag if isinstance(tag, int) and not isinstance(tag, bool) else None


def _markdown_of(kind: Any, view: Mapping[str, Any]) -> str:
    """The Markdown text of an event the page renders: thinking, an answer, a final answer."""
    if kind == "model_output":
        return str(view.get("thinking") or "")
    if kind == "answer":
        return str(view.get("answer") or "")
    if kind == "finished" and view.get("answered"):
        return str(view.get("prediction") or "")
    return ""


# ---------------------------------------------------------------- progress as text (/v1, MCP)


def progress_line(event: Mapping[str, Any], texts: TextsLike = DRVENUS_TEXTS) -> str | None:
    """One human line for a chat client's "thinking" pane, or None for quiet events; a Heavy
    run's lines start with ``[run i]``."""
    run = _run_of(event)
    if run is None:
        return _progress(event, texts)
    view = describe(event, texts) if event.get("type") == "finished" else {}
    line = _run_done(view) if view else _progress(event, texts)
    return None if line is None else f"[run {run + 1}] {line}"


def _run_done(view: Mapping[str, Any]) -> str:
    """A Heavy run's last line: its end in words and its answer (or why it has none)."""
    if view["answered"]:
        return f"{termination_words(view['termination'])}: {view['headline']}"
    return no_answer_reason(view)


def _progress(event: Mapping[str, Any], texts: TextsLike = DRVENUS_TEXTS) -> str | None:
    kind, view = event.get("type"), describe(event, texts)
    if kind == "started" and view.get("heavy"):
        how = "Voting over" if view.get("heavy_mode") == "vote" else "Writing one answer from"
        return f"{how} the answers of {view['heavy']} runs"
    if kind == "started":
        return f"Researching: {one_line(view['question'], 200)}"
    if kind == "step_started":
        return f"Step {int(event.get('step', 0)) + 1}"
    if kind == "model_output" and view["thinking"]:
        return f"Thinking: {one_line(view['thinking'], 400)}"
    if kind == "tool_call":
        if view["name"] == protocol.SEARCH:
            return "Searching: " + "; ".join(view["queries"])
        return "Visiting: " + ", ".join(view["urls"])
    if kind == "tool_result":
        return _result_lines(view)
    if kind == "error":
        what = error_words(view["kind"])
        line = what[:1].upper() + what[1:] if view["last"] else f"Retry ({what})"
        return f"{line}: {one_line(view['message'], 200)}".rstrip(": ")
    if kind == "limit_notice":
        return f"Limit reached ({view.get('reason') or 'budget'}): answering now"
    if kind == "compaction":
        return (f"Context compacted ({view['strategy']}): {view['tokens_before']} -> "
                f"{view['tokens_after']} tokens")
    return None


def _result_lines(view: Mapping[str, Any]) -> str:
    if "results" in view:
        lines = [
            f"  - {hit['title']} ({hit['url']})"
            for entry in view["results"]
            for hit in entry["hits"][:5]
        ]
        return "Found:\n" + "\n".join(lines) if lines else "Found nothing"
    if "pages" in view:
        parts = [
            f"  - {page['url']}: "
            + ("could not be read" if page["failed"] else one_line(page["summary"], 300))
            for page in view["pages"]
        ]
        return "Read:\n" + "\n".join(parts)
    return f"Tool said: {one_line(view.get('text', ''), 300)}"


def final_text(record: Mapping[str, Any], texts: TextsLike = DRVENUS_TEXTS) -> str:
    """The answer with the visited sources listed after it (or why there is no answer, in
    words, with the model's last thoughts as plain text)."""
    view = finished_view(record, texts)
    if view["answered"]:
        text = str(view["prediction"]).strip()
        if is_forced(record):  # the budget ran out: said, as the page marks it
            text += f"\n\n_{FORCED_NOTE}_"
    else:  # in words, as the page says it: never the model's raw markup
        text = no_answer_text({**record, "error": view["error"]})
    if view["sources"] and not (view["answered"] and lists_sources(text)):
        text += "\n\nSources:\n" + sources_markdown(view["source_pages"])
    return text


def report_markdown(record: Mapping[str, Any], run_id: str = "",
                    texts: TextsLike = DRVENUS_TEXTS) -> str:
    """A run's report to take away (Markdown): the question, the answer (or why there is
    none), the sources by title, and how the run went."""
    view = finished_view(record, texts)
    question = one_line(str(record.get("question") or ""), 2000)
    parts = [f"# {question}" if question else "# Research report"]
    if view["answered"]:
        parts.append(str(view["prediction"]).strip())
        if is_forced(record):
            parts.append(f"_{FORCED_NOTE}_")
    else:
        parts.append(no_answer_text({**record, "error": view["error"]}))
    if view["sources"]:
        parts.append("## Sources\n\n" + sources_markdown(view["source_pages"]))
    how = [termination_words(view["termination"]),
           f"{view['tool_call_count']} tool calls", f"{view['turns']} turns"]
    if view["heavy"]:
        how.append(f"{view['heavy']['runs']} runs, {view['heavy']['how']}")
    if view["elapsed_seconds"]:
        how.append(f"{float(view['elapsed_seconds']):.1f} s")
    parts.append("---\n\n" + " · ".join(how) + (f" · run {run_id}" if run_id else ""))
    return "\n\n".join(parts) + "\n"


# ------------------------------------------------------------------------------ saved files


def load_saved(text: str, texts: TextsLike = DRVENUS_TEXTS) -> list[dict[str, Any]]:
    """The runs of a saved file, each ``{"question", "events": [event dicts]}``: a trace
    (JSONL of events), result records (JSONL, a JSON array or one object, with
    ``messages``). Raises ValueError for anything else."""
    rows = _json_rows(text)
    if not rows:
        raise ValueError("the file holds no JSON records")
    if all("type" in row and "data" in row for row in rows):
        _check_shapes(rows, _event_problem, "event")
        runs = split_researches(rows)
    elif all(isinstance(row.get("messages"), list) for row in rows):
        _check_shapes(rows, _record_problem, "record")
        runs = [events_from_record(row, texts) for row in rows]
    else:
        raise ValueError(
            "not a trace (JSON lines of events) nor result records with messages"
        )
    return [{"question": _question_of(events), "events": events} for events in runs]


def _json_rows(text: str) -> list[dict[str, Any]]:
    rows = parse_json_text(text, "the file")
    if not all(isinstance(row, dict) for row in rows):
        raise ValueError("every record must be a JSON object")
    problem = json_problem(rows, MAX_JSON_DEPTH + 1)  # the list of rows is one level more
    if problem is not None:
        raise ValueError(problem)
    return rows


def _check_shapes(rows: list[dict[str, Any]], problem_of: Any, what: str) -> None:
    """ValueError naming the first row whose parts the views read are not of the right kind
    (an object where an object is read, a list of objects for messages)."""
    for n, row in enumerate(rows, 1):
        problem = problem_of(row)
        if problem is not None:
            raise ValueError(f"{what} {n}: {problem}")


def _messages_problem(messages: Any, where: str) -> str | None:
    if not isinstance(messages, list):
        return f"{where} is not a list"
    bad = next((i for i, m in enumerate(messages) if not isinstance(m, dict)), None)
    return None if bad is None else f"{where}[{bad}] is not an object"


def _record_problem(record: Any, where: str = "the record") -> str | None:
    if not isinstance(record, dict):
        return f"{where} is not an object"
    return _messages_problem(record.get("messages") or [], f"{where}'s messages")


def _event_problem(event: dict[str, Any]) -> str | None:
    data = event["data"]
    if not isinstance(data, dict):
        return "its data is not an object"
    # ``message`` is a conversation message where the event changes the conversation; an
    # ``error`` event's is its text
    keys = ("arguments",) if event.get("type") == "error" else ("message", "arguments")
    for key in keys:
        if data.get(key) is not None and not isinstance(data[key], dict):
            return f"its data.{key} is not an object"
    if data.get("messages") is not None:
        problem = _messages_problem(data["messages"], "its data.messages")
        if problem is not None:
            return problem
    return None if data.get("record") is None else _record_problem(data["record"],
                                                                     "its data.record")


def _question_of(events: list[EventDict]) -> str:
    for event in events:
        if event.get("type") == "started":
            return str((event.get("data") or {}).get("question", ""))
        if event.get("type") == "finished":
            return str(((event.get("data") or {}).get("record") or {}).get("question", ""))
    return ""


def events_from_record(record: Mapping[str, Any], texts: TextsLike = DRVENUS_TEXTS
                       ) -> list[EventDict]:
    """Trace events rebuilt from a result record's conversation, for replay; a Heavy record's
    runs first (tagged ``heavy_run``), then its decision."""
    runs = heavy_runs(record)
    if not runs:
        return _conversation_events(record, texts)
    events = [
        {**e, "data": {**e["data"], "heavy_run": i}}
        for i, run in enumerate(runs) for e in _conversation_events(run, texts)
    ]
    heavy = record["extra"]["heavy"]
    mode = "synthesis" if heavy.get("chosen_by") == "synthesis" else "vote"
    extra = {"heavy": len(runs), "heavy_mode": mode}
    if mode == "synthesis":
        return events + _conversation_events(record, texts, **extra)
    question = str(record.get("question") or "")
    events.append(_event("started", 0, question=question, messages=[], **extra))
    if str(record.get("termination", "")).startswith("answered"):
        events.append(_event("answer", 0, answer=record.get("prediction", ""), forced=False))
    events.append(_event("finished", 0, record=dict(record)))
    return events


def _conversation_events(record: Mapping[str, Any], texts: TextsLike = DRVENUS_TEXTS, **started: Any
                         ) -> list[EventDict]:
    """The events of one conversation (``started`` gets ``started`` as well)."""
    messages = [dict(m) for m in record.get("messages") or []]
    head = 2 if len(messages) >= 2 and messages[0].get("role") == "system" else 1
    question = str(record.get("question") or (messages[head - 1].get("content", "")
                                              if messages else ""))
    events = [_event("started", 0, question=question, messages=messages[:head], **started)]
    step = 0
    for message in messages[head:]:
        events.extend(_message_events(message, step, texts))
        if message.get("role") == "assistant":
            step += 1
    full = _completed(record, question, events, turns=step)
    events.append(_event("finished", max(step - 1, 0), record=full))
    return events


def _completed(record: Mapping[str, Any], question: str, events: list[EventDict], turns: int
               ) -> dict[str, Any]:
    """The record with what a bare trajectory (DR-Venus's ``{question, messages, gt}``, an SFT
    row) lacks, read from its own conversation: the answer, the termination, the counts."""
    full = dict(record)
    if full.get("termination"):
        return full
    answers = [e["data"]["answer"] for e in events if e["type"] == "answer"]
    full.setdefault("question", question)
    full["prediction"] = full.get("prediction") or (answers[-1] if answers else "")
    full["termination"] = "answered" if answers else "max_steps"
    full.setdefault("turns", turns)
    full.setdefault("tool_call_count", sum(1 for e in events if e["type"] == "tool_call"))
    return full


def _message_events(message: dict[str, Any], step: int, texts: TextsLike = DRVENUS_TEXTS
                    ) -> Iterator[EventDict]:
    content = str(message.get("content", ""))
    if message.get("role") == "assistant":
        parsed = protocol.parse_turn(protocol.repair_turn(content))
        yield _event("step_started", step)
        yield _event("model_output", step, text=parsed.content, kind=parsed.kind,
                     error=parsed.error)
        yield _event("turn", step, message=message, kind=parsed.kind)
        if parsed.tool_call is not None:
            call = parsed.tool_call
            yield _event("tool_call", step, name=call.name, arguments=call.arguments)
        elif parsed.answer is not None:
            yield _event("answer", step, answer=parsed.answer, forced=False)
        return
    step = max(step - 1, 0)
    body = protocol.unwrap_tool_response(content)
    kind = protocol.classify_tool_response(content, texts)
    if kind in ("search", "visit") and body is not None:
        yield _event("tool_result", step, message=message, name=kind, content=body)
    elif body is not None and protocol.notice_kind(body, texts) == "format_error":
        yield _event("format_error", step, message=message)
    elif body is not None and kind == "message":
        yield _event("limit_notice", step, message=message, replace=False)
    else:  # a tool error or another tool's reply
        yield _event("tool_result", step, message=message, name="tool", content=body or content)


def _event(type_: str, step: int, /, **data: Any) -> EventDict:
    return TraceEvent(type_, step, data, time=0.0).to_dict()  # type: ignore[arg-type]


__all__ = [
    "describe",
    "events_from_record",
    "final_text",
    "finished_view",
    "for_client",
    "headline",
    "heavy_runs",
    "load_saved",
    "progress_line",
    "report_markdown",
    "source_titles",
    "tokens_used",
    "tool_result_view",
    "visited_sources",
]
