from __future__ import annotations

import json

import pytest

from drvenus import protocol as P


# ---------------------------------------------------------------- real trajectories
def _trajectories(shared_data):
    files = sorted((shared_data / "trajectories" / "dr-venus-sft").glob("*.json"))
    assert len(files) == 10
    return [json.loads(f.read_text()) for f in files]


def test_every_assistant_turn_parses_and_middle_turns_are_well_formed(shared_data):
    for traj in _trajectories(shared_data):
        turns = [m["content"] for m in traj["messages"] if m["role"] == "assistant"]
        for content in turns[:-1]:
            parsed = P.parse_turn(content)
            assert parsed.kind == "tool_call", parsed.error
            assert P.check_turn_format(content, False)
            assert not P.check_turn_format(content, True)
        last = P.parse_turn(turns[-1])
        assert last.kind == "answer" and last.answer


def test_final_turns_follow_the_reference_checker(shared_data):
    # Two of the ten released final turns wrap a <summary> block in a second <answer> tag;
    # the DR-Venus checker rejects exactly those (one <answer> pair allowed), and so must we.
    verdicts = []
    for traj in _trajectories(shared_data):
        last = [m["content"] for m in traj["messages"] if m["role"] == "assistant"][-1]
        between = last[last.rindex("</think>") + len("</think>") : last.index("<answer>")]
        single = last.count("<answer>") == 1 and last.count("</answer>") == 1
        assert P.check_turn_format(last, True) == (single and not between.strip())
        verdicts.append(P.check_turn_format(last, True))
    assert verdicts.count(True) == 8


def test_every_tool_response_matches_a_renderer(shared_data):
    kinds = {"search": 0, "visit": 0}
    for traj in _trajectories(shared_data):
        for msg in traj["messages"][2:]:
            if msg["role"] != "user":
                continue
            kind = P.classify_tool_response(msg["content"])
            assert kind in kinds, msg["content"][:200]
            kinds[kind] += 1
            body = P.unwrap_tool_response(msg["content"])
            if kind == "search":
                data = P.parse_search_body(body)
                rerendered = P.render_search([(e["query"], e["web_page_info_list"]) for e in data])
                assert rerendered == body
            else:
                frames = P.parse_visit_body(body)
                again = P.join_visits(
                    [P.render_visit(f["url"], f["goal"], f["summary"], f["evidence"]) for f in frames]
                )
                assert again.rstrip("\n") == body.rstrip("\n")
    assert kinds["search"] > 50 and kinds["visit"] > 20


def test_conversation_shape_of_real_trajectories(shared_data):
    for traj in _trajectories(shared_data):
        roles = [m["role"] for m in traj["messages"]]
        assert roles[:2] == ["system", "user"]
        assert roles[2::2] == ["assistant"] * len(roles[2::2])
        assert traj["messages"][0]["content"].rstrip().splitlines()[-1].startswith("Current date:")


# ---------------------------------------------------------------- system prompt
def test_system_prompt_structure():
    text = P.build_system_prompt("2026-11-30")
    assert text.rstrip().endswith("Current date: 2026-11-30")
    assert "<answer></answer>" in text
    assert "# Tools" in text
    inner = text[text.index("<tools>\n") + 8 : text.index("\n</tools>")]
    specs = [json.loads(line) for line in inner.splitlines()]
    assert [s["function"]["name"] for s in specs] == ["search", "visit"]
    assert specs[0]["function"]["parameters"]["required"] == ["query"]
    assert specs[1]["function"]["parameters"]["required"] == ["url", "goal"]
    assert "<tool_call>" in text and '"arguments"' in text


def test_system_prompt_rejects_bad_date_and_file_replaces_it(tmp_path):
    with pytest.raises(ValueError):
        P.build_system_prompt("30/11/2026")
    f = tmp_path / "prompt.txt"
    f.write_text("My own prompt\nCurrent date: 2025-01-01\n")
    assert P.load_system_prompt(f) == "My own prompt\nCurrent date: 2025-01-01\n"
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError):
        P.load_system_prompt(tmp_path / "empty.txt")
    msgs = P.initial_messages("  Who?  ", "SYS")
    assert msgs == [{"role": "system", "content": "SYS"}, {"role": "user", "content": "  Who?  "}]


# ---------------------------------------------------------------- repair + parse
def test_repair_cuts_hallucinated_tool_response():
    text = '<think>\nx\n</think>\n<tool_call>\n{"name": "search", "arguments": {"query": ["a"]}}\n</tool_call>\n<tool_response>\nfake'
    fixed = P.repair_turn(text)
    assert "<tool_response>" not in fixed
    assert P.check_turn_format(fixed, False)


def test_repair_adds_missing_think_tags():
    prefilled = 'reasoning here\n</think>\n\n<answer>\nParis\n</answer>'
    assert P.repair_turn(prefilled).startswith("<think>\nreasoning")
    assert P.check_turn_format(P.repair_turn(prefilled), True)
    no_close = '<think>\nhmm <tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'
    fixed = P.repair_turn(no_close)
    assert "hmm\n</think>\n<tool_call>" in fixed
    assert P.check_turn_format(fixed, False)
    bare = "just thinking aloud"
    assert P.repair_turn(bare) == "<think>\njust thinking aloud\n</think>"
    assert P.repair_turn("   ") == ""


def test_parse_tool_call_normalisation():
    t = P.parse_turn('<think>a</think><tool_call>{"name": "search", "arguments": {"queries": "x", "k": 3}}</tool_call>')
    assert t.kind == "tool_call"
    assert t.tool_call.arguments == {"query": ["x"]}
    v = P.parse_turn(
        "<think>a</think><tool_call>{name: 'visit', arguments: {urls: 'https://a.org', goal: ['g1', 'g2']}}</tool_call>"
    )
    assert v.tool_call == P.ToolCall("visit", {"url": ["https://a.org"], "goal": "g1"})
    both = P.normalize_tool_call(
        {"name": "search", "arguments": {"queries": ["old"], "query": ["new"]}}
    )
    assert both.arguments == {"query": ["new"]}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no tags at all", "missing <think>"),
        ("<think>a</think>", "no <tool_call> or <answer>"),
        ("<think>a</think><tool_call>{not json</tool_call>", "not valid JSON"),
        ('<think>a</think><tool_call>{"name": "python", "arguments": {}}</tool_call>',
         "Available tools: search, visit"),
        ('<think>a</think><tool_call>{"name": "search"}</tool_call>', "'name' and 'arguments'"),
        ('<think>a</think><tool_call>{"name": "search", "arguments": {"query": []}}</tool_call>',
         "at least one"),
        ('<think>a</think><tool_call>{"name": "visit", "arguments": {"url": "u"}}</tool_call>',
         "goal"),
        ("<think>a</think><answer>x</answer><tool_call>{}</tool_call>", "both"),
        ("<think>a</think><answer>  </answer>", "empty"),
    ],
)
def test_parse_errors_carry_a_reason(text, reason):
    t = P.parse_turn(text)
    assert t.kind == "error" and not t.ok
    assert reason in t.error


def test_tool_call_key_and_signature():
    a = P.ToolCall("search", {"query": ["b", "a", "a"]})
    assert a.signature() == ("search", ("a", "b"))
    assert a.key() == P.ToolCall("search", {"query": ["b", "a", "a"]}).key()
    assert a.key() != P.ToolCall("search", {"query": ["a", "b"]}).key()
    assert json.loads(a.to_json()) == {"name": "search", "arguments": {"query": ["b", "a", "a"]}}


# ---------------------------------------------------------------- format checker
GOOD_CALL = '<think>\nx\n</think>\n<tool_call>\n{"name": "search", "arguments": {"query": ["q"]}}\n</tool_call>'
GOOD_ANSWER = "<think>\nx\n</think>\n<answer>\nParis\n</answer>"


@pytest.mark.parametrize(
    ("content", "final", "expected"),
    [
        (GOOD_CALL, False, True),
        (GOOD_ANSWER, True, True),
        (GOOD_CALL, True, False),
        (GOOD_ANSWER, False, False),
        ("", False, False),
        ("   \n", True, False),
        ("text" + GOOD_CALL, False, False),
        ("  \n" + GOOD_CALL, False, True),
        (GOOD_CALL + "\ntrailing", False, False),
        (GOOD_CALL + "\n\n", False, True),
        ("<think>a</think><think>b</think><answer>x</answer>", True, True),
        ("<think>a<think>b</think></think><answer>x</answer>", True, False),
        ("<think>a</think>b</think><answer>x</answer>", True, False),
        ("</think><think>a</think><answer>x</answer>", True, False),
        ("<think>a</think>stray<answer>x</answer>", True, False),
        ("<think>a</think><answer></answer>", True, False),
        ("<think>a</think><answer>x</answer><answer>y</answer>", True, False),
        ("<think>a</think><answer>x", True, False),
        ("<think>a</think><answer>x</answer><tool_call>", True, False),
        ("<think>a</think><tool_call></tool_call>", False, False),
        ("<think>a</think><tool_call>[1, 2]</tool_call>", False, False),
        ('<think>a</think><tool_call>{"name": "x", "arguments": "s"}</tool_call>', False, False),
        ('<think>a</think><tool_call>{"name": "x", "arguments": {}}</tool_call>', False, True),
        ("<think>a</think><tool_call>{name: 'x', arguments: {a: 1,},}</tool_call>", False, True),
        ('<think>a</think><tool_call>{"arguments": {}}</tool_call>', False, False),
        ("<think>a</think><tool_call>PythonInterpreter <code>print(1)</code></tool_call>", False,
         True),
        ("<think>a</think><tool_call>pythoninterpreter <code>x</tool_call>", False, False),
        ('<think>a</think><tool_call>{"name": "x", "arguments": {}}</tool_call><answer>y</answer>',
         False, False),
        ('<tool_call>{"name": "x", "arguments": {}}</tool_call><think>a</think>', False, False),
        ('<think>a</think><tool_call>{"name": "x", "arguments": {}}</tool_call></tool_call>',
         False, False),
        ("<think></think><answer>x</answer>", True, True),
    ],
)
def test_check_turn_format(content, final, expected):
    assert P.check_turn_format(content, final) is expected


# ---------------------------------------------------------------- renderers
def test_search_renderer_shape():
    body = P.render_search(
        [("q1", [{"title": "T", "url": "https://x", "snippet": "s", "extra": 1}]), ("q2", [])]
    )
    data = json.loads(body)
    assert data == [
        {"query": "q1", "web_page_info_list": [{"title": "T", "url": "https://x", "snippet": "s"}]},
        {"query": "q2", "web_page_info_list": []},
    ]
    assert P.classify_tool_response(P.wrap_tool_response(body)) == "search"
    assert P.render_search([("é", [])]) == '[{"query": "é", "web_page_info_list": []}]'


def test_visit_renderer_frames():
    one = P.render_visit("https://a.org/x", "find y", "sum", "ev")
    assert one == (
        "The useful information in https://a.org/x for user goal find y as follows: \n\n"
        "Evidence in page: \nev\n\nSummary: \nsum\n\n"
    )
    two = P.join_visits([one, P.render_visit_failure("https://b.org", "find y")])
    frames = P.parse_visit_body(two)
    assert [f["url"] for f in frames] == ["https://a.org/x", "https://b.org"]
    assert "could not be accessed" in frames[1]["evidence"]
    assert "could not be processed" in frames[1]["summary"]
    assert P.classify_tool_response(P.wrap_tool_response(two)) == "visit"
    assert P.classify_tool_response("plain text") is None
    assert P.classify_tool_response(P.wrap_tool_response(P.FORMAT_ERROR_MESSAGE)) == "message"


def test_limit_messages_ask_for_an_answer():
    assert "maximum context length" in P.CONTEXT_LIMIT_MESSAGE
    assert "maximum number of tool calls" in P.STEP_LIMIT_MESSAGE
    for msg in (P.CONTEXT_LIMIT_MESSAGE, P.STEP_LIMIT_MESSAGE, P.FORMAT_ERROR_MESSAGE):
        assert "<answer></answer>" in msg


def test_turn_renderers_produce_well_formed_turns():
    call = P.ToolCall("search", {"query": ["a"]}).to_json()
    turn = P.render_tool_call_turn("thinking", call)
    assert P.check_turn_format(turn, False) and P.parse_turn(turn).tool_call.arguments == {"query": ["a"]}
    final = P.render_answer_turn("done", "Paris")
    assert P.check_turn_format(final, True) and P.parse_turn(final).answer == "Paris"


# --- byte-exact tool responses against the released training data ------------------------------


def _tool_responses(shared) -> list[str]:
    folder = shared / "trajectories" / "dr-venus-sft"
    found = []
    for path in sorted(folder.glob("*.json")):
        for message in json.loads(path.read_text(encoding="utf-8"))["messages"]:
            if message["role"] == "user" and message["content"].startswith(P.TOOL_RESPONSE_OPEN):
                found.append(message["content"])
    return found


def test_search_and_visit_responses_are_byte_identical_to_the_training_data(shared_data):
    kinds: dict[str, int] = {"search": 0, "visit": 0}
    for content in _tool_responses(shared_data):
        body = P.unwrap_tool_response(content)
        assert body is not None
        searched = P.parse_search_body(body)
        if searched is not None:
            pairs = [(e["query"], e["web_page_info_list"]) for e in searched]
            rendered = P.render_search(pairs)
            kinds["search"] += 1
        else:
            frames = P.parse_visit_body(body)
            assert frames is not None, body[:200]
            rendered = P.join_visits(
                [P.render_visit(f["url"], f["goal"], f["summary"], f["evidence"]) for f in frames]
            )
            kinds["visit"] += 1
        assert P.wrap_tool_response(rendered) == content
    assert kinds["search"] > 100 and kinds["visit"] > 50, kinds


def test_visit_failure_keeps_the_frame_structure():
    body = P.join_visits([P.render_visit_failure("https://a.example/x", "g")])
    frames = P.parse_visit_body(body)
    assert frames is not None and frames[0]["url"] == "https://a.example/x"
    assert not body.endswith("\n")
    first = P.render_visit("https://a.example/1", "g", "s1")
    two = P.join_visits([first, P.render_visit_failure("u", "g")])
    assert "s1\n\n" + P.VISIT_SEPARATOR in two  # inner frames keep their blank line, as DR-Venus's


# --- the system prompt from a trajectory file --------------------------------------------------


def test_system_prompt_from_trajectory_files(tmp_path, shared_data):
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = shared_data / "trajectories" / "dr-venus-sft" / "0000.json"
    row = json.loads(source.read_text(encoding="utf-8"))
    expected = row["messages"][0]["content"]
    assert P.load_system_prompt(source) == expected
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n" + json.dumps(row) + "\n" + json.dumps({"messages": []}) + "\n")
    assert P.load_system_prompt(jsonl) == expected
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(row["messages"]))
    assert P.load_system_prompt(bare) == expected
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q", "messages": row["messages"]}]), parquet)
    assert P.load_system_prompt(parquet) == expected
    text = tmp_path / "prompt.txt"
    text.write_text("You are a careful researcher.")
    assert P.load_system_prompt(text) == "You are a careful researcher."


def test_system_prompt_file_errors_are_readable(tmp_path):
    no_system = tmp_path / "rows.jsonl"
    no_system.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(ValueError, match="no system message"):
        P.load_system_prompt(no_system)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        P.load_system_prompt(broken)
    wrong = tmp_path / "wrong.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), wrong)
    with pytest.raises(ValueError, match="messages"):
        P.load_system_prompt(wrong)
