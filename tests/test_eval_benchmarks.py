"""Benchmark loaders: synthetic round trips of both encryption schemes, the real encrypted files
(checked in memory only: nothing decrypted is printed or written), and the plain formats."""

from __future__ import annotations

import csv
import json
import unicodedata

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from drvenus.eval import benchmarks as bm
from drvenus.protocol import ANSWER_SPLIT

CANARY = "SYNTHETIC CANARY do-not-train 1234"


def _write_csv(path, header, rows):
    with path.open("w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def test_both_schemes_round_trip_and_differ():
    text = "Which bridge, 桥, opened in 1932? ✓"
    sha, raw = bm.browsecomp_key(CANARY), bm.xbench_key(CANARY)
    assert bm.decrypt(bm.encrypt(text, sha), sha) == text
    assert bm.decrypt(bm.encrypt(text, raw), raw) == text
    assert bm.encrypt(text, sha) != bm.encrypt(text, raw)
    assert len(sha) == 32 and raw == CANARY.encode()


def test_browsecomp_csv_round_trip(tmp_path):
    key = bm.browsecomp_key(CANARY)
    rows = [[bm.encrypt(f"question {i} " * 20, key), bm.encrypt(f"answer {i}", key), CANARY, "Art"]
            for i in range(3)]
    path = tmp_path / "bc.csv"
    _write_csv(path, ["problem", "answer", "canary", "problem_topic"], rows)
    items = bm.load("browsecomp", path)
    assert [i.answer for i in items] == ["answer 0", "answer 1", "answer 2"]
    assert items[1].question.startswith("question 1 ") and items[0].id == "1"
    assert items[0].meta["topic"] == "Art"


def test_browsecomp_zh_xlsx_round_trip(tmp_path):
    openpyxl = pytest.importorskip("openpyxl")
    key = bm.browsecomp_key(CANARY)
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["Topic", "Question", "Answer", "canary"])
    sheet.append([bm.encrypt("艺术", key), bm.encrypt("哪座桥？", key), bm.encrypt("金门大桥", key),
                  CANARY])
    sheet.append([None, None, None, None])
    path = tmp_path / "zh.xlsx"
    book.save(path)
    (item,) = bm.load("browsecomp-zh", path)
    assert (item.question, item.answer, item.meta["topic"]) == ("哪座桥？", "金门大桥", "艺术")


def test_xbench_csv_round_trip(tmp_path):
    key = bm.xbench_key(CANARY)
    path = tmp_path / "xb.csv"
    _write_csv(path, ["id", "prompt", "answer", "reference_steps", "canary"],
               [["7", bm.encrypt("问题七", key), bm.encrypt("答案", key), "", CANARY]])
    (item,) = bm.load("xbench-deepsearch", path)
    assert (item.id, item.question, item.answer) == ("7", "问题七", "答案")
    # the other scheme's key does not decrypt it
    with pytest.raises(UnicodeDecodeError):
        bm.decrypt(bm.encrypt("问题七问题七问题七", key), bm.browsecomp_key(CANARY))


def test_encrypted_files_that_do_not_decrypt_name_file_row_column_and_a_hint(tmp_path):
    plain = tmp_path / "plain.csv"
    _write_csv(plain, ["problem", "answer", "canary"], [["Who wrote Dracula?", "Bram Stoker", "x"]])
    with pytest.raises(ValueError) as info:
        bm.load("browsecomp", plain)
    line = str(info.value)
    assert line.startswith("plain.csv row 1, column problem: is not encrypted")
    assert "-b jsonl" in line and "padding" not in line
    key = bm.browsecomp_key(CANARY)
    wrong = tmp_path / "wrong-canary.csv"
    _write_csv(wrong, ["problem", "answer", "canary"],
               [[bm.encrypt("Which bridge opened in 1932, and where?", key),
                 bm.encrypt("Sydney Harbour Bridge", key), CANARY],
                [bm.encrypt("Which bridge opened in 1932, and where?", key),
                 bm.encrypt("Sydney Harbour Bridge", key), "another canary"]])
    with pytest.raises(ValueError, match=r"^wrong-canary.csv row 2, column problem: does not "
                                         r"decrypt to text with the row's canary"):
        bm.load("browsecomp", wrong)


def _plausible(text: str) -> bool:
    """Decrypted text looks like real text: no control characters but white space."""
    return bool(text.strip()) and all(
        c in "\n\t\r" or unicodedata.category(c)[0] != "C" for c in text
    )


@pytest.mark.parametrize(
    ("name", "file", "count"),
    [
        ("xbench-deepsearch", "xbench-deepsearch-2505.encrypted.csv", 100),
        ("xbench-deepsearch", "xbench-deepsearch-2510.encrypted.csv", 100),
        ("browsecomp-zh", "browsecomp-zh.encrypted.xlsx", 289),
    ],
)
def test_real_encrypted_files_decrypt_in_memory(shared_data, name, file, count):
    if file.endswith(".xlsx"):
        pytest.importorskip("openpyxl")
    items = bm.load(name, shared_data / "benchmarks" / file)  # strict UTF-8 decoding throughout
    assert len(items) == count and len({i.id for i in items}) == count
    assert all(_plausible(i.question) and _plausible(i.answer) for i in items)
    assert not any("canary" in (i.question + i.answer).lower() for i in items)
    # Chinese benchmarks: most questions contain CJK characters
    cjk = sum(any("\u4e00" <= c <= "\u9fff" for c in i.question) for i in items)
    assert cjk >= count * 0.9


def test_gaia_jsonl_and_text_only(tmp_path):
    path = tmp_path / "metadata.jsonl"
    rows = [
        {"task_id": "a", "Question": "Q1", "Final answer": "17", "Level": 1, "file_name": ""},
        {"task_id": "b", "Question": "Q2", "Final answer": "x, y", "Level": 2,
         "file_name": "b.xlsx"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert [i.id for i in bm.load("gaia", path)] == ["a", "b"]
    (item,) = bm.load("gaia-text", path)
    assert (item.id, item.answer, item.meta["level"]) == ("a", "17", "1")


def test_deepsearchqa_csv(tmp_path):
    path = tmp_path / "dsqa.csv"
    _write_csv(path, ["example_id", "problem", "problem_category", "answer", "answer_type"],
               [["e1", "Name three", "Geo", "A, B, C", "Set"], ["e2", "One", "Geo", "Z", "Single"]])
    items = bm.load("deepsearchqa", path)
    assert [i.meta["answer_type"] for i in items] == ["Set", "Single"]


def test_generic_jsonl_and_rl_parquet(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"id": 5, "question": "Q", "answer": ["a", "b"]}) + "\n"
                    + "not json\n" + json.dumps({"question": "no answer"}) + "\n",
                    encoding="utf-8")
    (item,) = bm.load("jsonl", path)
    assert (item.id, item.answer, item.answers) == ("5", "a", ["a", "b"])
    table = pa.Table.from_pylist([{
        "data_source": "nq", "prompt": [{"role": "user", "content": "Who?"}],
        "reward_model": {"ground_truth": f"X{ANSWER_SPLIT}Y", "style": "rule"},
        "extra_info": {"index": "nq_1", "split": "test"},
    }])
    pq.write_table(table, tmp_path / "rl.parquet")
    (item,) = bm.load("parquet", tmp_path / "rl.parquet")
    assert (item.id, item.question, item.answers) == ("nq_1", "Who?", ["X", "Y"])


def test_real_rl_parquet(shared_data):
    items = bm.load("parquet", shared_data / "qa" / "deepresearcher-mix-test.parquet")
    assert len(items) == 3197 and all(i.question and i.answer for i in items)
    assert any(len(i.answers) > 1 for i in items)


def test_hotpotqa_items_and_corpus(shared_data):
    path = shared_data / "qa" / "hotpotqa-dev-500-with-paragraphs.jsonl"
    items = bm.load("hotpotqa-paragraphs", path)
    docs = list(bm.hotpotqa_corpus(path))
    assert len(items) == 500 and len(docs) == 4858
    urls = {d["url"] for d in docs}
    assert len(urls) == len(docs)
    assert all(len(i.meta["gold_urls"]) == 2 and set(i.meta["gold_urls"]) <= urls for i in items)
    assert all(i.answer for i in items)


def test_unknown_benchmark_and_missing_columns(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark"):
        bm.load("nope", tmp_path / "x.csv")
    path = tmp_path / "bad.csv"
    _write_csv(path, ["question"], [["q"]])
    with pytest.raises(ValueError, match="missing column"):
        bm.load("browsecomp", path)
    with pytest.raises(FileNotFoundError):
        bm.load("jsonl", tmp_path / "missing.jsonl")
