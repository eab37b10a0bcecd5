"""``rl --protocol dr-venus``'s outcome judge and ``eval``'s judge share one HTTP transport: the
same judge URL (with or without ``/v1``) reaches the same server, and a failed request is tried
again under the one retry policy (never a 4xx). A real stub server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import re

import pytest

from drvenus.grading.judge import JudgeConfig, judge_many_async
from drvenus.net import normalize_base_url, server_root
from drvenus.reference.dr_venus_rl import RLJudgeTexts
from drvenus.train.rl.judge import make_dr_venus_judge
from stub_server import Reply, StubServer

TEXTS = RLJudgeTexts(
    source="fixture", files={}, prompt="Q: {question}\nA: {response}\nGold: {correct_answer}\n",
    verdict=r"verdict\s*=\s*(yes|no)", flags=re.IGNORECASE, zero_answers=("",))
PROMPT = "<|im_start|>user\nWho wrote Dune?<|im_end|>\n<|im_start|>assistant\n"
CASES = [("Herbert", "Frank Herbert"), ("Asimov", "Frank Herbert"), ("F. Herbert", "Frank Herbert")]


def verdict(request) -> str:
    """One reply both judges read: eval's ``Correct``/``Incorrect`` and DR-Venus's verdict."""
    content = request.json["messages"][0]["content"]
    return "Incorrect. verdict=no" if "Asimov" in content else "Correct. verdict=yes"


def rl_scores(url: str, items=None) -> list[float]:
    judge = make_dr_venus_judge(TEXTS, url, "judge", concurrency=2)
    assert judge is not None
    items = items or [(PROMPT, f"<think>\nx\n</think>\n<answer>\n{a}\n</answer>", gt, "Q")
                      for a, gt in CASES]
    scores, _ = asyncio.run(judge.score(items))
    return scores


@pytest.fixture(autouse=True)
def _no_judge_env(monkeypatch):
    for name in ("DRVENUS_JUDGE_BASE_URL", "DRVENUS_JUDGE_MODEL", "DRVENUS_JUDGE_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def test_one_base_url_rule():
    for url in ("127.0.0.1:9", "http://127.0.0.1:9", "http://127.0.0.1:9/", "http://127.0.0.1:9/v1",
                "http://127.0.0.1:9/v1/chat/completions"):
        assert normalize_base_url(url) == "http://127.0.0.1:9/v1"
        assert server_root(url) == "http://127.0.0.1:9"


@pytest.mark.parametrize("with_v1", [False, True])
def test_rl_judge_scores_as_eval_does_on_the_same_url(with_v1, tmp_path):
    with StubServer([], default=verdict) as server:
        url = server.base_url if with_v1 else server.url
        rl = rl_scores(url)
        cfg = JudgeConfig(base_url=url, model="judge", cache_path=tmp_path / "cache.sqlite")
        verdicts = asyncio.run(judge_many_async([("Q", a, gt) for a, gt in CASES], cfg))
        paths = {r.path for r in server.requests}
    assert rl == [1.0, 0.0, 1.0]
    assert rl == [1.0 if v.correct else 0.0 for v in verdicts]
    assert paths == {"/v1/chat/completions"}


def test_a_4xx_is_not_asked_again_and_a_5xx_is():
    with StubServer([Reply(status=400)], default=verdict) as server:
        assert rl_scores(server.url, [(PROMPT, "<answer>Asimov</answer>", "Frank Herbert", "Q")]
                         ) == [0.0]
        assert len(server.chat_requests) == 1
    with StubServer([Reply(status=503), ""], default=verdict) as server:
        assert rl_scores(server.url, [(PROMPT, "<answer>Herbert</answer>", "Frank Herbert", "Q")]
                         ) == [1.0]
        assert len(server.chat_requests) == 3  # a 503 and an empty reply, asked again
