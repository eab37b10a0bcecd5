"""One chat-template module for SFT and RL: RL's turn boundaries, end-of-turn tokens, reward
anchors and IG pseudo answer work on every template SFT's tests use (the embedded SmolLM2's
ChatML, the Qwen3-style thinking template with its prefilled ``<think>``), and on a non-ChatML
one (Gemma-style ``<start_of_turn>`` / ``<end_of_turn>``, tokens added to the same vocabulary).
"""

from __future__ import annotations

import asyncio

import pytest

from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.llm.base import SamplingParams
from scripted import ScriptedTools, answer, call

transformers = pytest.importorskip("transformers", reason="needs the train extra")
pytest.importorskip("torch")

from drvenus.train.rl.batch import turn_end_positions  # noqa: E402
from drvenus.train.rl.engine import TokenGeneration  # noqa: E402
from drvenus.train.rl.ig import pseudo_answer  # noqa: E402
from drvenus.train.rl.recorder import ChatTemplateParts, TokenRecorder  # noqa: E402
from drvenus.train.sft.tokenize import tokenize_conversation  # noqa: E402
from drvenus.train.templates import (  # noqa: E402
    CHATML,
    end_of_turn_ids,
    find_turn_ends,
    turn_markers,
)
from helpers.templates import GEMMA_STYLE_TEMPLATE, QWEN3_STYLE_TEMPLATE  # noqa: E402

THINK = "<think>\n"


@pytest.fixture(scope="module")
def tokenizers(embedded_tokenizer_dir, tmp_path_factory):
    chatml = transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)
    qwen3 = transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)
    qwen3.chat_template = QWEN3_STYLE_TEMPLATE
    gemma = transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)
    gemma.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    gemma.chat_template = GEMMA_STYLE_TEMPLATE
    return {"chatml": chatml, "qwen3-thinking": qwen3, "gemma": gemma}


EXPECTED = {  # (end-of-turn token, assistant header, header start token, role)
    "chatml": ("<|im_end|>", "<|im_start|>assistant\n", "<|im_start|>", "assistant"),
    "qwen3-thinking": ("<|im_end|>", "<|im_start|>assistant\n", "<|im_start|>", "assistant"),
    "gemma": ("<end_of_turn>", "<start_of_turn>model\n", "<start_of_turn>", "model"),
}


class TemplateEngine:
    """Scripted turns sampled as their own tokenisation plus the template's end-of-turn token
    (without the ``<think>\\n`` a thinking template already put in the prompt)."""

    name = "fake"

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, list(script)
        self.eot = tokenizer.convert_tokens_to_ids(turn_markers(tokenizer).end_of_turn)
        self.prefilled = ChatTemplateParts(tokenizer).prefilled_think
        self.prompts: list[list[int]] = []

    async def generate_tokens(self, prompt_ids, params, *, timeout=None):
        self.prompts.append(list(prompt_ids))
        text = self.script.pop(0)
        if self.prefilled:
            text = text.removeprefix(THINK)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return TokenGeneration(ids + [self.eot], text, "stop", len(prompt_ids))

    async def context_window(self):
        return 8192

    async def aclose(self):
        pass


def _rollout(tokenizer):
    script = [call("search", query=["Dune author"]), call("visit", url=["https://a.org"], goal="g"),
              answer("Frank Herbert")]
    engine = TemplateEngine(tokenizer, script)
    recorder = TokenRecorder(engine)
    config = AgentConfig(max_steps=4, max_attempts=1, backoff_base=0.0, current_date="2026-11-30",
                         sampling=SamplingParams(max_tokens=64))
    agent = ResearchAgent(recorder, ScriptedTools("Dune is by Frank Herbert."), config)
    result = asyncio.run(agent.run("Who wrote Dune?"))
    return result, recorder.record(result.messages), engine


@pytest.mark.parametrize("name", list(EXPECTED))
def test_markers_are_read_off_the_template(tokenizers, name):
    tok = tokenizers[name]
    m = turn_markers(tok)
    eot, header, start, role = EXPECTED[name]
    assert (m.end_of_turn, m.assistant_header, m.header_start, m.header_role) == \
        (eot, header, start, role)
    assert m.turn_close == eot + "\n"
    assert tok.convert_tokens_to_ids(eot) in end_of_turn_ids(tok)
    assert ChatTemplateParts(tok).turn_close == m.turn_close


def test_a_tokenizer_without_template_gets_chatml(tokenizers):
    class Bare:
        chat_template = None

    assert turn_markers(Bare()) == CHATML


@pytest.mark.parametrize("name", list(EXPECTED))
def test_rl_turns_end_and_anchor_on_every_template(tokenizers, name):
    tok = tokenizers[name]
    eot_text = EXPECTED[name][0]
    eot = tok.convert_tokens_to_ids(eot_text)
    result, rec, engine = _rollout(tok)
    assert result.termination == "answered" and rec is not None
    assert [b.tool_name for b in rec.boundaries] == ["search", "visit", None]
    # every prompt the policy saw extends the record; each sampled turn ends at end-of-turn
    for prompt in engine.prompts:
        assert rec.input_ids[: len(prompt)] == prompt
    for b, end in zip(rec.boundaries, rec.generated_ends, strict=True):
        assert rec.input_ids[end - 1] == eot
        head = tok.decode(rec.input_ids[: b.token_len], skip_special_tokens=False)
        assert head.endswith(EXPECTED[name][1] + (THINK if engine.prefilled else ""))
    # reward anchors: the end-of-turn token of the tool response before each next turn
    ends = find_turn_ends(rec.response_ids, tok)
    assert len(ends) == len(rec.boundaries) - 1
    for end, b in zip(ends, rec.boundaries[1:], strict=True):
        pos = rec.prompt_len + end
        assert rec.input_ids[pos] == eot and eot not in rec.input_ids[pos + 1 : b.token_len]
    assert turn_end_positions(rec.input_ids, rec.prompt_len, tok,
                              [b.token_len for b in rec.boundaries]) == ends
    # the IG pseudo answer closes with the template's end-of-turn token
    ids, (lo, hi) = pseudo_answer(tok, "Frank Herbert")
    assert ids[-1] == eot and tok.decode(ids[lo:hi]).strip() == "Frank Herbert"
    # SFT masks the same conversation's turns through the same end-of-turn token
    row = tokenize_conversation(result.messages, tok)
    trained = [i for i, m in zip(row.input_ids, row.loss_mask, strict=True) if m]
    assert trained.count(eot) == len(rec.boundaries)
