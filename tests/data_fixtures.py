"""Builders of data-pipeline test inputs from the real shared trajectories.

``raw_row`` turns a cleaned DR-Venus trajectory back into a raw REDSearcher row: search JSON
rendered as Serper markdown, tool calls in legacy shapes, and optional faults (duplicate calls,
disallowed tools, malformed turns). Also a tiny OpenAI-compatible judge stub server, and the
command line that regenerates the golden values of tests/test_data_clean.py (see there):

    python tests/data_fixtures.py build-reference-input DIR
    python tests/data_fixtures.py reference-values OUT_DIR SHUFFLED_OUT_DIR

The shared data folder is ``conftest.SHARED_DATA`` (one definition); tests that use these
builders take the ``shared_data`` fixture, which skips them when the folder is absent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pprint
import random
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from conftest import SHARED_DATA  # tests/ is on sys.path: pytest, a script here, the benchmark
from drvenus.data.workers import ChunkTask
from drvenus.protocol import parse_search_body, unwrap_tool_response

TRAJ_DIR = SHARED_DATA / "trajectories" / "dr-venus-sft"


def load_trajectories(directory: Path = TRAJ_DIR) -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.json"))]


def serper_markdown(entries: list[dict[str, Any]], rng: random.Random | None = None) -> str:
    """Search JSON entries rendered the way Serper's markdown looks."""
    blocks = []
    for entry in entries:
        hits = entry["web_page_info_list"]
        lines = [f"A Google search for '{entry['query']}' found {len(hits)} results:", "",
                 "## Web Results"]
        for n, hit in enumerate(hits, 1):
            lines.append(f"{n}. [{hit['title']}]({hit['url']})")
            if rng is not None and rng.random() < 0.3:
                lines.append("Date published: 2023-05-01")
            lines.append(hit["snippet"])
            lines.append("")
        blocks.append("\n".join(lines))
    return "\n=======\n".join(blocks)


def _legacy_call(content: str, rng: random.Random, json5_rate: float | None = None) -> str:
    """Rewrite the tool call of an assistant turn in a legacy but accepted shape."""
    head, _, rest = content.partition("<tool_call>")
    body, _, tail = rest.partition("</tool_call>")
    call = json.loads(body)
    args = call["arguments"]
    style = rng.randrange(4)
    if call["name"] == "search" and style == 1:
        args = {"queries": args["query"]}
    elif call["name"] == "search" and style == 2 and len(args["query"]) == 1:
        args = {"query": args["query"][0]}
    elif call["name"] == "visit" and style == 1:
        args = {"urls": args["url"], "goal": [args["goal"]]}
    elif call["name"] == "visit" and style == 2 and len(args["url"]) == 1:
        args = {"url": args["url"][0], "goal": args["goal"]}
    text = json.dumps({"name": call["name"], "arguments": args}, ensure_ascii=False)
    if style == 3 and (json5_rate is None or rng.random() < json5_rate):  # JSON5 quotes
        text = text.replace('{"name": "', "{'name': '", 1).replace('", "arguments"', "', 'arguments'", 1)
    return f"{head}<tool_call>\n{text}\n</tool_call>{tail}"


def raw_row(
    traj: dict[str, Any],
    rng: random.Random,
    *,
    duplicates: int = 0,
    disallowed: int = 0,
    malformed: int = 0,
    question_suffix: str = "",
    extra_turns: list[dict[str, str]] | None = None,
    json5_rate: float | None = None,
) -> dict[str, Any]:
    """A raw REDSearcher row built from a cleaned trajectory, with optional faults."""
    msgs = traj["messages"][1:]  # drop the system prompt
    question = msgs[0]["content"] + question_suffix
    out: list[dict[str, str]] = [{"role": "user", "content": question}]
    middle = msgs[1:-1]
    pairs = [middle[i : i + 2] for i in range(0, len(middle), 2)]
    if extra_turns:
        pairs += [extra_turns[i : i + 2] for i in range(0, len(extra_turns), 2)]
    for pair in pairs:
        assistant = pair[0]
        out.append({"role": "assistant", "content": _legacy_call(assistant["content"], rng, json5_rate)})
        for resp in pair[1:]:
            body = unwrap_tool_response(resp["content"]) or ""
            entries = parse_search_body(body)
            if entries is not None:
                body = serper_markdown(entries, rng)
            out.append({"role": "user", "content": f"<tool_response>\n{body}\n</tool_response>"})
    tool_turns = [i for i, m in enumerate(out) if m["role"] == "assistant"]
    for _ in range(duplicates):
        i = rng.choice(tool_turns)
        copy = out[i : i + 2]
        pos = len(out)
        out[pos:pos] = [dict(m) for m in copy]
    for k in range(disallowed):
        pos = rng.choice([i for i, m in enumerate(out) if m["role"] == "assistant"] or [1])
        out[pos:pos] = [
            {"role": "assistant", "content": "<think>\nLet me run some code.\n</think>\n"
             f"<tool_call>\n{{\"name\": \"google_scholar\", \"arguments\": {{\"query\": [\"q{k}\"]}}}}"
             "\n</tool_call>"},
            {"role": "user", "content": "<tool_response>\nscholar results\n</tool_response>"},
        ]
    for _ in range(malformed):
        pos = rng.choice([i for i, m in enumerate(out) if m["role"] == "assistant"] or [1])
        out[pos:pos] = [
            {"role": "assistant", "content": "<think>\nbroken call\n</think>\n<tool_call>\n"
             "{name: search, arguments: [}\n</tool_call>"},
            {"role": "user", "content": "<tool_response>\nerror\n</tool_response>"},
        ]
    final = msgs[-1]["content"]
    out.append({"role": "assistant", "content": final})
    return {
        "meta": {"question": question, "answer": traj["gt"]},
        "messages": out,
        "system_prompt": "You are a raw-data assistant.",
    }


RAW_SCHEMA = pa.schema([
    pa.field("meta", pa.struct([pa.field("question", pa.string()),
                                pa.field("answer", pa.string())])),
    pa.field("messages", pa.list_(pa.struct([pa.field("role", pa.string()),
                                             pa.field("content", pa.string())]))),
    pa.field("system_prompt", pa.string()),
])


def write_raw_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=RAW_SCHEMA), path)
    return path


def fault_rows(trajs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Raw rows that hit every stage-1 and validation drop reason, one each (in order)."""
    t = trajs[0]
    rng = random.Random(7)
    base = raw_row(t, rng)

    def variant(fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        row = json.loads(json.dumps(base))
        fn(row)
        return row

    def set_msgs(msgs):
        return lambda r: r.__setitem__("messages", msgs)

    think_answer = "<think>\nok\n</think>\n<answer>\nx\n</answer>"
    call = '<think>\nsearch\n</think>\n<tool_call>\n{"name": "search", "arguments": {"query": ["a"]}}\n</tool_call>'
    return [
        # missing_question_or_gt
        variant(lambda r: r["meta"].__setitem__("answer", "")),
        # raw_clean_failed: last turn without an answer
        variant(lambda r: r["messages"][-1].__setitem__("content", "<think>\nno answer\n</think>")),
        # raw_clean_failed: a tool-role message in the middle
        variant(lambda r: r["messages"].insert(2, {"role": "tool", "content": "x"})),
        # too_short: only the question
        variant(set_msgs([{"role": "user", "content": "q"}])),
        # first_user_contains_tool_response
        variant(set_msgs([{"role": "user", "content": "<tool_response>\nq\n</tool_response>"},
                          {"role": "assistant", "content": think_answer}])),
        # bad_role_at_2: question then the final answer is fine, so break alternation instead
        variant(set_msgs([{"role": "user", "content": "q"},
                          {"role": "user", "content": "<tool_response>\nr\n</tool_response>"},
                          {"role": "assistant", "content": think_answer}])),
        # final answer with a tool call inside -> final_assistant_contains_tool
        variant(set_msgs([{"role": "user", "content": "q"},
                          {"role": "assistant", "content": think_answer + "\n<tool_call>{}</tool_call>"}])),
        # call dropped in normalisation, so the tool response is orphaned and skipped
        variant(set_msgs([{"role": "user", "content": "q"},
                          {"role": "assistant", "content": "no think <tool_call>{}</tool_call>"},
                          {"role": "user", "content": "<tool_response>\nr\n</tool_response>"},
                          {"role": "assistant", "content": think_answer}])),
        # duplicates only: the whole second call goes
        variant(set_msgs([{"role": "user", "content": "q"},
                          {"role": "assistant", "content": call},
                          {"role": "user", "content": "<tool_response>\nr\n</tool_response>"},
                          {"role": "assistant", "content": call},
                          {"role": "user", "content": "<tool_response>\nr\n</tool_response>"},
                          {"role": "assistant", "content": think_answer}])),
    ]


def clean_rows(trajs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Already-clean rows that hit the clean-input drop reasons."""
    t = trajs[1]
    bad_middle = [dict(m) for m in t["messages"]]
    bad_middle[2] = {"role": "assistant", "content": "<think>\nx\n</think>\nno call"}
    answer_in_call = [dict(m) for m in t["messages"]]
    answer_in_call[2] = {"role": "assistant",
                         "content": answer_in_call[2]["content"] + "<answer>x</answer>"}
    no_think = [dict(m) for m in t["messages"]]
    no_think[2] = {"role": "assistant", "content": "<tool_call>{}</tool_call>"}
    no_resp = [dict(m) for m in t["messages"]]
    no_resp[3] = {"role": "user", "content": "plain text"}
    bad_role = [dict(m) for m in t["messages"]]
    bad_role[2] = {"role": "user", "content": bad_role[3]["content"]}
    final_tool = [dict(m) for m in t["messages"]]
    final_tool[-1] = {"role": "assistant",
                      "content": final_tool[-1]["content"] + "\n<tool_call>{}</tool_call>"}
    null_content = [dict(m) for m in t["messages"]]
    null_content[4] = {"role": "assistant", "content": None}
    final_no_answer = [dict(m) for m in t["messages"]]
    final_no_answer[-1] = {"role": "assistant", "content": "<think>\nx\n</think>"}
    return [
        {"question": t["question"], "messages": t["messages"], "gt": t["gt"]},
        {"question": t["question"], "messages": [], "gt": t["gt"]},  # clean_input_invalid
        {"question": t["question"], "messages": t["messages"][1:], "gt": t["gt"]},  # no system
        {"question": t["question"], "messages": bad_middle, "gt": t["gt"]},
        {"question": t["question"], "messages": answer_in_call, "gt": t["gt"]},
        {"question": t["question"], "messages": no_think, "gt": t["gt"]},
        {"question": t["question"], "messages": no_resp, "gt": t["gt"]},
        {"question": t["question"], "messages": final_no_answer, "gt": t["gt"]},
        {"question": t["question"], "messages": t["messages"][:2], "gt": t["gt"]},
        {"question": t["question"], "messages": bad_role, "gt": t["gt"]},
        {"question": t["question"], "messages": final_tool, "gt": t["gt"]},
        {"question": t["question"], "messages": null_content, "gt": t["gt"]},
        {"question": "", "messages": t["messages"], "gt": t["gt"]},
    ]


CLEAN_SCHEMA = pa.schema([
    pa.field("question", pa.string()),
    pa.field("messages", pa.list_(pa.struct([pa.field("role", pa.string()),
                                             pa.field("content", pa.string())]))),
    pa.field("gt", pa.string()),
])


def write_clean_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=CLEAN_SCHEMA), path)
    return path


def long_turns(trajs: list[dict[str, Any]], n_pairs: int, rng: random.Random) -> list[dict]:
    """Extra (assistant, tool response) pairs borrowed from other trajectories (for long
    trajectories); queries are made unique so they are not duplicates."""
    pool = []
    for t in trajs:
        m = t["messages"][2:-1]
        pool += [m[i : i + 2] for i in range(0, len(m) - 1, 2)]
    out = []
    for k in range(n_pairs):
        a, r = rng.choice(pool)
        body = a["content"]
        head, _, rest = body.partition("<tool_call>")
        call_text, _, tail = rest.partition("</tool_call>")
        call = json.loads(call_text)
        if call["name"] == "search":
            call["arguments"]["query"] = [q + f" #{k}" for q in call["arguments"]["query"]]
        else:
            call["arguments"]["url"] = [u + f"?v={k}" for u in call["arguments"]["url"]]
        new = f"{head}<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>{tail}"
        out += [{"role": "assistant", "content": new}, dict(r)]
    return out


def tiny_clean_row(k: int) -> dict[str, Any]:
    """A small valid already-clean row (question, one search call and its response, the
    answer ``A{k}``) that needs no shared data."""
    call = ('<think>\nlook it up\n</think>\n<tool_call>\n{"name": "search", "arguments": '
            f'{{"query": ["q{k}"]}}}}\n</tool_call>')
    return {"question": f"Q{k}?", "gt": f"A{k}", "messages": [
        {"role": "system", "content": "S"},
        {"role": "user", "content": f"Q{k}?"},
        {"role": "assistant", "content": call},
        {"role": "user", "content": "<tool_response>\n[]\n</tool_response>"},
        {"role": "assistant", "content": f"<think>\ndone\n</think>\n<answer>\nA{k}\n</answer>"},
    ]}


def write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    """Rows as a parquet file with the schema Arrow infers (any columns)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# --------------------------------------------------------------------------- judge stub


class JudgeStub:
    """A minimal OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1.

    Replies ``Correct`` when the predicted answer line contains ``correct_marker``; a request
    whose answer contains ``fail_marker`` gets HTTP 500. Counts requests.
    """

    def __init__(self, correct_marker: str = "", fail_marker: str = "FAILJUDGE"):
        self.requests = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):  # noqa: N802 - http.server API
                n = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(n))
                stub.requests += 1
                prompt = body["messages"][-1]["content"]
                predicted = prompt.split("Predicted answer:", 1)[1].split("\n\n", 1)[0]
                gt = prompt.split("Ground-truth answer", 1)[1].split("\n\n", 1)[0]
                if fail_marker in predicted:
                    self.send_response(500)
                    self.end_headers()
                    return
                gt_text = gt.split(":", 1)[1].strip().lower()
                ok = (correct_marker and correct_marker in predicted) or (
                    gt_text and gt_text in predicted.lower()
                )
                reply = {"choices": [{"message": {"role": "assistant",
                                                  "content": "Correct" if ok else "Incorrect"}}]}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> JudgeStub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def build_reference_input(directory: Path) -> Path:
    """The mixed input of the reference-equivalence test: 10 raw rows from the shared
    trajectories with faults and long variants, 9 raw fault rows, 13 clean rows (3 shards)."""
    trajs = load_trajectories()
    rng = random.Random(1)
    rows = []
    for i, t in enumerate(trajs):
        extra = long_turns(trajs, [0, 30, 90][i % 3], rng) if i % 2 else None
        rows.append(raw_row(t, rng, duplicates=i % 3, disallowed=i % 2, malformed=(i + 1) % 2,
                            question_suffix=f" v{i}", extra_turns=extra))
    rows += fault_rows(trajs)
    write_raw_parquet(rows[:12], directory / "train-00000.parquet")
    write_raw_parquet(rows[12:], directory / "train-00001.parquet")
    write_clean_parquet(clean_rows(trajs), directory / "train-00002.parquet")
    return directory


# --------------------------------------------------------------------------- golden values

# The stats.json keys of DR-Venus's script that tests/test_data_clean.py pins.
REFERENCE_STAT_KEYS = (
    "rows", "pruned_tool_turns_removed", "pruned_tool_response_turns_removed",
    "pruned_tool_name_counts", "duplicate_tool_turns_removed", "drop_reasons",
    "tools_after_cleaning", "turn_buckets", "multiplier_distribution",
)


def rows_digest(path: Path) -> str:
    """sha256 of ``[[question, messages[1:], gt], ...]`` of a cleaned parquet (the system prompt
    is left out: DR-Venus's is not ours)."""
    rows = pq.read_table(path).to_pylist()
    blob = json.dumps([[r["question"], r["messages"][1:], r["gt"]] for r in rows],
                      ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def shuffled_order(path: Path) -> list[tuple[str, int, int]]:
    """(file digit, source row, copy) of each row of a ``--keep-metadata`` output."""
    rows = pq.read_table(path, columns=["_source_file", "_source_row", "_sample_copy"]).to_pylist()
    return [(r["_source_file"][-9], r["_source_row"], r["_sample_copy"]) for r in rows]


def reference_values(out: Path, shuffled: Path) -> dict[str, Any]:
    """The golden values from two runs of the reference script (plain, and shuffled)."""
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    return {
        "REFERENCE_STATS": {k: stats[k] for k in REFERENCE_STAT_KEYS},
        "REFERENCE_PER_FILE_DUPLICATES": {
            name: st["duplicate_tool_turns_removed"] for name, st in stats["per_file"].items()
        },
        "REFERENCE_ROWS_SHA256": rows_digest(out / "cleaned_resampled.parquet"),
        "REFERENCE_SHUFFLED": shuffled_order(shuffled / "cleaned_resampled.parquet"),
    }



# --------------------------------------------------------------------------- a held chunk
HOLD_DIR = "DRVENUS_TEST_HOLD_DIR"  # where a held chunk says it started and waits to go on


class HeldChunkTask(ChunkTask):
    """``data clean``'s chunk task that, in its worker, writes ``started-<pid>`` into the folder
    ``$DRVENUS_TEST_HOLD_DIR`` names and waits (at most a minute) for a ``go`` file there
    before it runs: a test interrupts a run in a known state (a chunk in flight) instead of
    sleeping and hoping the run is still going."""

    def __call__(self, chunk):
        import os
        import time

        hold = Path(os.environ[HOLD_DIR])
        (hold / f"started-{os.getpid()}").touch()
        deadline = time.monotonic() + 60
        while not (hold / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return super().__call__(chunk)


def run_cli_with_held_chunks(argv: list[str]) -> None:
    """``drvenus ARGV`` with :class:`HeldChunkTask` (``python -c`` of a Ctrl-C test)."""
    import sys

    from drvenus.cli import main as cli_main
    from drvenus.data import pipeline

    pipeline.ChunkTask = HeldChunkTask
    sys.argv = ["drvenus", *argv]
    cli_main()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Inputs and golden values of the data tests.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build-reference-input").add_argument("directory", type=Path)
    ref = sub.add_parser("reference-values")
    ref.add_argument("out", type=Path)
    ref.add_argument("shuffled_out", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "build-reference-input":
        print(build_reference_input(args.directory))
        return
    for name, value in reference_values(args.out, args.shuffled_out).items():
        print(f"{name} = {pprint.pformat(value, width=100, sort_dicts=False)}")


if __name__ == "__main__":
    main()
