"""The web demo in a real headless browser (Debian's chromium driven by Playwright), on the real
``drvenus serve`` with the embedded model and the built-in corpus: ask, watch a search step and
the answer appear, reload mid-run (reconnect), look at it phone-wide, replay the saved trace;
then one /v1 chat completion through the ``openai`` client on the same server.

Screenshots go to ``$DRVENUS_ARTIFACTS`` (else the test's temp dir); CI keeps them as artifacts.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from helpers.cli import ROOT
from helpers.serve import Served

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
QUESTION = "Who wrote the novel Dracula?"
RUN_TIMEOUT_MS = 300_000

pytestmark = pytest.mark.slow


def _chromium() -> str:
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if not path:
        if os.environ.get("DRVENUS_REQUIRE_BROWSER"):  # set by .ci/run: CI must run this test
            pytest.fail("no chromium browser, and DRVENUS_REQUIRE_BROWSER is set")
        pytest.skip("no chromium browser (Debian: apt-get install chromium); .ci/run installs it")
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory, models_dir):
    tmp = tmp_path_factory.mktemp("serve-e2e")
    pythonpath = os.pathsep.join(
        p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p
    )
    env = {**os.environ, "PYTHONPATH": pythonpath, "DRVENUS_MODELS_DIR": str(models_dir),
           "DRVENUS_CACHE_DIR": str(tmp / "cache")}
    env.pop("DRVENUS_SERVE_TOKEN", None)
    server = Served(tmp / "runs", env)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    folder = os.environ.get("DRVENUS_ARTIFACTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def browser():
    executable = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (dev extra)")
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _answer_shown(page) -> str:
    page.wait_for_selector("#answer:not([hidden])", timeout=RUN_TIMEOUT_MS)
    page.wait_for_selector("#c-status.done, #c-status.failed", timeout=RUN_TIMEOUT_MS)
    return page.inner_text("#a-text")


def test_ask_watch_reconnect_replay_in_a_browser(served, browser, artifacts):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(served.url + "/")
    page.wait_for_selector("#opt-model option", state="attached")  # settings from the server
    from drvenus.small.preset import EMBEDDED_AGENT

    assert page.input_value("#opt-steps") == str(EMBEDDED_AGENT.max_steps)  # the preset's limit
    about = page.inner_text("#model-about")  # what the embedded model is and can do
    assert "SmolLM2-135M" in about and "trained adapter" in about
    page.fill("#question", QUESTION)
    page.click("#ask-btn")
    # a search step appears while the run goes on
    page.wait_for_selector(".tool.search .chip", timeout=RUN_TIMEOUT_MS)
    run_id = page.evaluate("location.hash").split("run=", 1)[1]
    # reload mid-run: the page reconnects to the run's stream and replays what it missed
    page.reload()
    page.wait_for_selector(".tool.search .chip", timeout=RUN_TIMEOUT_MS)
    answer = _answer_shown(page)
    assert answer.strip()
    assert page.inner_text("#v-question") == QUESTION
    assert page.locator("#timeline .hits li a").count() >= 1  # result titles with links
    assert int(page.inner_text("#c-steps")) >= 1
    page.screenshot(path=str(artifacts / "serve-desktop.png"), full_page=True)

    phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True,
                             device_scale_factor=2)
    phone.goto(f"{served.url}/#run={run_id}")
    assert _answer_shown(phone) == answer
    overflow = phone.evaluate("document.documentElement.scrollWidth")
    assert overflow <= 390, f"the page is {overflow}px wide on a 390px screen"
    phone.screenshot(path=str(artifacts / "serve-phone.png"), full_page=True)
    phone.close()

    # replay the run's saved trace step by step
    trace = served.runs_dir / f"{run_id}.jsonl"
    assert trace.is_file()
    page.click("button[data-tab=replay]")
    page.set_input_files("#replay-file", str(trace))
    page.wait_for_selector("#player:not([hidden])")
    assert page.locator("#answer:not([hidden])").count() == 0  # only the first event shown
    for _ in range(3):
        page.click("#rp-next")
    page.click("#rp-all")
    assert page.inner_text("#a-text") == answer
    assert page.locator(".tool.search .chip").count() >= 1
    page.screenshot(path=str(artifacts / "serve-replay.png"), full_page=True)
    assert not errors, errors
    page.close()


def test_v1_chat_completion_on_the_embedded_model(served):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="local", max_retries=0,
                           timeout=400)
    start = time.monotonic()
    reply = client.chat.completions.create(
        model="drvenus", messages=[{"role": "user", "content": QUESTION}]
    )
    message = reply.choices[0].message
    assert message.content.strip()
    assert "Searching:" in message.model_extra["reasoning_content"]
    assert reply.usage.completion_tokens > 0
    assert time.monotonic() - start < 400


def test_research_with_a_remote_model_in_a_browser(tmp_path, browser, artifacts, shared_data):
    """``serve --base-url`` (the DR-Venus-4B case, here a loopback OpenAI-compatible stub): the
    page offers the model's own 200-step limit, Research runs, the answer shows as Markdown and
    comes into view; a step limit the server refuses opens the settings and says why; run links
    and Back follow runs, an unknown run says so; a DR-Venus trajectory replays with its answer."""
    from helpers.cli import search_turn
    from stub_server import StubServer

    answer = "<think>\nDone.\n</think>\n<answer>\n**Bram Stoker** wrote it\n</answer>"
    pythonpath = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath, "DRVENUS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("DRVENUS_SERVE_TOKEN", None)
    with StubServer([search_turn("Dracula novel author"), answer], default=answer) as model:
        served = Served(tmp_path / "runs", env, "--base-url", model.base_url)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 700})
            errors: list[str] = []
            missing: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("response", lambda r: missing.append(r.url)
                    if r.status >= 400 and "/api/" not in r.url else None)  # files, favicon
            page.goto(served.url + "/")
            page.wait_for_selector("#opt-model option", state="attached")
            assert page.input_value("#opt-steps") == "200"
            assert model.base_url not in page.content()  # a preset never shows the server URL
            page.fill("#question", QUESTION)
            page.click("#settings summary")  # open, set beyond the cap, close again
            page.fill("#opt-steps", "100000")
            page.click("#settings summary")
            page.click("#ask-btn")  # refused with a reason, the panel opened
            page.wait_for_selector("#flash:not([hidden])")
            assert "Step limit" in page.inner_text("#flash")
            assert page.evaluate("document.getElementById('settings').open")
            page.fill("#opt-steps", "200")
            page.click("#ask-btn")
            assert _answer_shown(page).strip() == "Bram Stoker wrote it"
            assert page.inner_text("#a-text strong") == "Bram Stoker"  # Markdown, rendered
            page.wait_for_function("document.getElementById('answer').getBoundingClientRect()"
                                   ".top < window.innerHeight")  # brought into view
            assert model.base_url not in page.inner_text("#v-meta")
            assert page.locator(".tool.search .chip").count() >= 1
            assert int(page.inner_text("#c-steps")) == page.locator("#timeline > li").count()
            first = page.evaluate("location.hash")
            page.screenshot(path=str(artifacts / "serve-remote.png"), full_page=True)

            page.evaluate("location.hash = 'run=nope'")  # a link to a run this server lacks
            page.wait_for_selector("#c-status.failed")
            assert "no such run" in page.inner_text("#c-status")
            page.go_back()  # Back: the first run again
            page.wait_for_function(f"location.hash === {first!r}")
            assert _answer_shown(page).strip() == "Bram Stoker wrote it"

            page.click("button[data-tab=replay]")
            assert page.get_attribute("button[data-tab=replay]", "aria-selected") == "true"
            page.set_input_files("#replay-file",
                                 str(shared_data / "trajectories" / "dr-venus-sft" / "0000.json"))
            page.wait_for_selector("#player:not([hidden])")
            page.click("#rp-all")
            assert page.inner_text("#a-text").strip() == "Paul Beneke"
            assert "No answer" not in page.inner_text("#answer h3")
            titles = page.locator("#timeline > li h4").all_text_contents()
            assert titles[0] == "Step 1" and not any("step limit" in t for t in titles)
            assert "24 tool calls" in page.inner_text("#a-meta")
            assert not errors, errors
            assert not missing, missing  # the favicon too
            page.close()
        finally:
            served.stop()


MARKDOWN_ANSWER = """Bram Stoker wrote it.

| Book | Year |
|---|--:|
| Dracula | 1897 |

> Listen to them, the children of the night.

```python
first = 1
second = 2
```

See [the disambiguation](https://en.wikipedia.org/wiki/Dracula_(disambiguation)).
Read https://en.wikipedia.org/wiki/Dracula. Also https://example.org/book: more.
A snake_case_name and 2*3*4 stay as written.
<script>window.hacked = 1</script><img src=x onerror="window.hacked = 2">
[click](javascript:window.hacked=3)"""

FOLLOW_STEPS = 10


def _scripted_model(request) -> dict:
    """Replies by question and by how many turns the run had: "follow" searches FOLLOW_STEPS
    times then answers in Markdown, "stop" keeps searching slowly, anything else answers."""
    from helpers.cli import search_turn

    messages = request.json["messages"]
    question = next(m["content"] for m in messages if m["role"] == "user")
    turns = sum(1 for m in messages if m["role"] == "assistant")
    answer = f"<think>\nDone.\n</think>\n<answer>\n{MARKDOWN_ANSWER}\n</answer>"
    if question.startswith("follow") and turns < FOLLOW_STEPS:
        return {"content": search_turn(f"Dracula fact number {turns}"), "delay": 0.6}
    if question.startswith("stop"):
        return {"content": search_turn(f"Stoker detail {turns}"), "delay": 1.5}
    return {"content": answer, "delay": 0.3}


def _bottom_gap(page) -> float:
    return page.evaluate("document.documentElement.scrollHeight - window.innerHeight"
                         " - window.scrollY")


def test_markdown_stale_content_and_follow_in_a_browser(tmp_path, browser, artifacts,
                                                        shared_data):
    """The issue's Markdown cases rendered by the server's parser, nothing executable; the page
    follows a live run while at the bottom and offers "Jump to latest" otherwise; nothing
    stale stays on screen (a bad replay after a good one, the Runs tab, an empty question, a
    reload mid-run); Stop says so in words and leaves no empty step; a replay without timings
    shows no zero counters; the answer copies as Markdown."""
    from stub_server import StubServer

    pythonpath = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath, "DRVENUS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("DRVENUS_SERVE_TOKEN", None)
    with StubServer(default=_scripted_model) as model:
        served = Served(tmp_path / "runs", env, "--base-url", model.base_url)
        try:
            context = browser.new_context(viewport={"width": 1000, "height": 600},
                                          permissions=["clipboard-read", "clipboard-write"])
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(served.url + "/")
            page.wait_for_selector("#opt-model option", state="attached")

            # an empty question replaces an old, unrelated banner with the right one
            page.evaluate("flash('an old error')")
            page.click("#ask-btn")
            assert page.inner_text("#flash") == "Type a question to research."

            # follow: at the bottom the page keeps up with new steps
            page.fill("#question", "follow: who wrote Dracula?")
            page.click("#ask-btn")
            page.wait_for_selector("#timeline > li:nth-child(3) .hits", timeout=RUN_TIMEOUT_MS)
            page.wait_for_function("document.documentElement.scrollHeight > "
                                   "window.innerHeight + 200")
            page.wait_for_selector("#timeline > li:nth-child(4) .hits", timeout=RUN_TIMEOUT_MS)
            assert _bottom_gap(page) < 80, "the page did not follow the new steps"
            assert page.locator("#jump:not([hidden])").count() == 0
            # scrolled up to read: the page stays put and offers a jump
            page.evaluate("window.scrollTo(0, 0)")
            page.wait_for_selector("#timeline > li:nth-child(6) .hits", timeout=RUN_TIMEOUT_MS)
            page.wait_for_selector("#jump:not([hidden])")
            assert page.evaluate("window.scrollY") < 50
            page.click("#jump")
            page.wait_for_function("document.documentElement.scrollHeight - window.innerHeight"
                                   " - window.scrollY < 80")
            answer = _answer_shown(page)

            # Markdown: the cases, rendered by the server and sanitised
            assert page.locator("#a-text table td").all_text_contents() == ["Dracula", "1897"]
            assert "children of the night" in page.inner_text("#a-text blockquote")
            assert page.inner_text("#a-text pre code").strip() == "first = 1\nsecond = 2"
            hrefs = page.eval_on_selector_all("#a-text a", "els => els.map(a => a.href)")
            assert "https://en.wikipedia.org/wiki/Dracula_(disambiguation)" in hrefs
            assert "https://en.wikipedia.org/wiki/Dracula" in hrefs  # not "...Dracula."
            assert "https://example.org/book" in hrefs  # not "...book:"
            assert not any(h.startswith("javascript:") for h in hrefs)
            assert "snake_case_name and 2*3*4 stay as written." in answer
            assert page.locator("#a-text em, #a-text script, #a-text img").count() == 0
            assert page.evaluate("window.hacked") is None
            # copy: the answer's Markdown, in one click
            page.click("#copy-btn")
            page.wait_for_function("document.getElementById('copy-btn').textContent === 'Copied'")
            assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN_ANSWER
            assert "1 tool calls" not in page.inner_text("#a-meta")
            page.locator("#answer").screenshot(path=str(artifacts / "serve-markdown.png"))

            # the Runs tab shows the list alone, from the top
            page.click("button[data-tab=runs]")
            page.wait_for_selector("#run-list li .q")
            assert page.locator("#view").is_hidden()
            assert page.evaluate("window.scrollY") == 0

            # a reload mid-run: Research stays off and the step box shows the run's limit
            page.click("button[data-tab=ask]")
            page.fill("#question", "stop: who wrote Dracula?")
            page.click("#settings summary")
            page.fill("#opt-steps", "120")  # far more than the test lasts: still running
            followed = page.evaluate("location.hash")
            page.click("#ask-btn")
            # the new run's own steps (the last run's chips are on screen until it starts)
            page.wait_for_function(f"location.hash !== {followed!r}")
            page.wait_for_selector(".tool.search .chip", timeout=RUN_TIMEOUT_MS)
            page.reload()
            page.wait_for_selector(".tool.search .chip", timeout=RUN_TIMEOUT_MS)
            page.wait_for_selector("#stop-btn:not([hidden])")
            assert page.is_disabled("#ask-btn")
            assert page.input_value("#opt-steps") == "120"
            # Stop: said in words, and no empty step card is left
            page.click("#stop-btn")
            page.wait_for_selector("#c-status.failed", timeout=RUN_TIMEOUT_MS)
            assert page.inner_text("#a-text") == "Stopped before the model gave an answer."
            cards = page.eval_on_selector_all("#timeline > li", "els => els.map(e => e.children.length)")
            assert cards and min(cards) > 1, cards
            assert not page.is_disabled("#ask-btn")

            # replay: a good file, then a bad one: the old replay goes, one clear banner
            page.click("button[data-tab=replay]")
            trajectory = shared_data / "trajectories" / "dr-venus-sft" / "0000.json"
            page.set_input_files("#replay-file", str(trajectory))
            page.wait_for_selector("#player:not([hidden])")
            page.click("#rp-all")
            assert page.inner_text("#a-text").strip() == "Paul Beneke"
            # rebuilt from messages: no timings, no token counts, so no "0" counters
            assert page.locator("#c-time-box").is_hidden()
            assert page.locator("#c-tokens-box").is_hidden()
            bad = tmp_path / "bad.jsonl"
            bad.write_text("not json at all\n")
            page.set_input_files("#replay-file", str(bad))
            page.wait_for_selector("#flash:not([hidden])")
            banner = page.inner_text("#flash")
            assert banner.startswith("Cannot replay bad.jsonl: ") and banner.count("replay") == 1
            assert page.locator("#view").is_hidden() and page.locator("#player").is_hidden()
            assert not errors, errors
            context.close()
        finally:
            served.stop()


def test_heavy_runs_shown_in_lanes_in_a_browser(tmp_path, browser, artifacts):
    """Heavy mode on the page (a scripted model on an in-process server): the runs' steps in
    a lane each, in run order, each lane ending with its run's answer; the synthesis last and
    its answer in the answer box; a bad run count refused in words; the stored run replays
    in the same lanes."""
    from drvenus.serve.app import create_app
    from drvenus.serve.server import ServeThread
    from helpers.serve import SYNTHESISED
    from helpers.serve import make_heavy_registry as make_registry

    with ServeThread(create_app(make_registry(tmp_path / "runs"))) as running:
        page = browser.new_page(viewport={"width": 1000, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(running.url + "/")
        page.wait_for_selector("#opt-model option", state="attached")
        assert page.get_attribute("#opt-heavy", "max") == "4"
        page.click("#settings summary")
        page.fill("#opt-heavy", "9")
        page.fill("#question", "Who wrote Dracula?")
        page.click("#ask-btn")
        assert page.inner_text("#flash") == "Heavy runs: give a whole number from 1 to 4."
        page.fill("#opt-heavy", "3")
        page.click("#ask-btn")
        assert _answer_shown(page).startswith(SYNTHESISED)
        run_id = page.evaluate("location.hash").split("run=", 1)[1]

        def lanes() -> list[str]:
            heads = page.locator("#timeline > li.lane > .lane-head")
            return [heads.nth(i).inner_text() for i in range(heads.count())]

        heads = lanes()
        assert [h.split(" · ")[0] for h in heads] == ["Run 1", "Run 2", "Run 3",
                                                       "Synthesis of 3 runs"], heads
        assert all(h.endswith("Answered: Bram Stoker") for h in heads[:3]), heads
        for i in range(3):
            assert page.locator(f"#timeline > li.lane[data-run='{i}'] li.step").count() == 3
        assert page.inner_text("#c-steps") == "10"
        assert "3 runs, synthesised" in page.inner_text("#a-meta")
        page.screenshot(path=str(artifacts / "serve-heavy.png"), full_page=True)

        page.click("button[data-tab=replay]")
        page.set_input_files("#replay-file", str(tmp_path / "runs" / f"{run_id}.jsonl"))
        page.wait_for_selector("#player:not([hidden])")
        page.click("#rp-all")
        assert lanes() == heads
        assert page.inner_text("#a-text").startswith(SYNTHESISED)
        assert not errors, errors
        page.close()


LIVE_SEARCHES = 16
RUN_ANSWER = """## Who wrote it

**Bram Stoker** wrote *Dracula* (1897); see [the article](https://en.wikipedia.org/wiki/Dracula).

| Book | Year |
|---|---|
| Dracula | 1897 |

- first published by Archibald Constable and Company in London, in May 1897
- an epistolary novel told in letters, diary entries and newspaper cuttings"""
FINAL_ANSWER = "Bram Stoker wrote Dracula, as all three runs found."


def _heavy_live_script(question: str) -> list[str]:
    """Heavy runs that search for a while ("live": then answer in Markdown; "stop": until
    stopped); the synthesis turn answers at once."""
    from scripted import answer, call

    if question.startswith("Question:"):
        return [answer(FINAL_ANSWER)]
    if question.startswith("stop"):
        return [call("search", query=[f"Stoker detail {i}"]) for i in range(60)]
    return [*(call("search", query=[f"Dracula fact {i}"]) for i in range(LIVE_SEARCHES)),
            answer(RUN_ANSWER)]


def _heavy_live_delay(question: str) -> float:
    return 0.02 if question.startswith("Question:") else 0.4


# each run's lane: how many step cards, and whether its latest card is on screen (not scrolled
# out of the page or of its lane, not under the sticky bar)
LANES_SEEN = """() => [...document.querySelectorAll('#timeline > li.lane:not(.decision)')].map(lane => {
  const steps = lane.querySelectorAll('li.step');
  const last = steps[steps.length - 1];
  if (!last) return [0, false];
  const r = last.querySelector('h4').getBoundingClientRect();
  const hit = document.elementFromPoint(r.left + 4, r.top + r.height / 2);
  return [steps.length, Boolean(hit && last.contains(hit))];
})"""


def _lanes_followed(pages: list, runs: int, artifacts: Path) -> None:
    """On every page, every run's lane shows its latest step, twice: once the lanes are longer
    than the screen, and again after every lane moved on; nothing is wider than the screen."""
    for page in pages:
        page.wait_for_function(f"(() => {{ const s = ({LANES_SEEN})(); return s.length === "
                               f"{runs} && s.every(([n]) => n >= 5); }})()",
                               timeout=RUN_TIMEOUT_MS)
    before = [page.evaluate(LANES_SEEN) for page in pages]
    for page, seen in zip(pages, before, strict=True):
        width = page.viewport_size["width"]
        page.screenshot(path=str(artifacts / f"serve-heavy-live-{width}.png"))
        assert all(shown for _, shown in seen), (width, seen)
    for page, seen in zip(pages, before, strict=True):
        counts = [n for n, _ in seen]
        page.wait_for_function(f"({LANES_SEEN})().every(([n], i) => n > {counts}[i])",
                               timeout=RUN_TIMEOUT_MS)
        now = page.evaluate(LANES_SEEN)
        width = page.viewport_size["width"]
        assert all(shown for _, shown in now), (width, now)
        assert page.evaluate("document.documentElement.scrollWidth") <= width


def test_heavy_live_lanes_in_a_browser(tmp_path, browser, artifacts):
    """Following a live Heavy run (3 runs, desktop and phone): every run's lane is on screen
    and moves on, not only the last; lane headers are one short plain line (no run's whole
    Markdown answer); the final answer is shown once; nothing overflows a phone's width; a
    stopped Heavy run says it stopped, not "by vote"."""
    from drvenus.serve.app import create_app
    from drvenus.serve.server import ServeThread
    from helpers.serve import make_heavy_registry

    registry = make_heavy_registry(tmp_path / "runs", script=_heavy_live_script,
                                   delay=_heavy_live_delay, max_steps=80)
    with ServeThread(create_app(registry)) as running:
        desk = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        desk.on("pageerror", lambda exc: errors.append(str(exc)))
        desk.goto(running.url + "/")
        desk.wait_for_selector("#opt-model option", state="attached")
        desk.click("#settings summary")
        desk.fill("#opt-heavy", "3")
        desk.fill("#question", "live: who wrote Dracula?")
        desk.click("#ask-btn")
        desk.wait_for_function("location.hash.startsWith('#run=')")
        run_id = desk.evaluate("location.hash").split("run=", 1)[1]
        phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True,
                                 device_scale_factor=2)
        phone.on("pageerror", lambda exc: errors.append(str(exc)))
        phone.goto(f"{running.url}/#run={run_id}")

        _lanes_followed([desk, phone], 3, artifacts)
        heads = desk.locator("#timeline > li.lane > .lane-head").all_inner_texts()
        assert all(len(h) < 80 for h in heads), heads  # live: the run and what it is doing

        for page in (desk, phone):
            assert _answer_shown(page) == FINAL_ANSWER
            heads = page.locator("#timeline > li.lane:not(.decision) > .lane-head").all_inner_texts()
            assert len(heads) == 3, heads
            for head in heads:
                assert "\n" not in head.strip() and len(head) <= 140, head
                assert not any(mark in head for mark in ("**", "##", "|", "](", "- ")), head
                # the answer's first paragraph, past its heading
                assert head.endswith("Answered: Bram Stoker wrote Dracula (1897); see the "
                                     "article."), head
            body = page.inner_text("body")
            assert body.count(FINAL_ANSWER) == 1, body  # the final answer, once
            assert "3 runs, synthesised" in page.inner_text("#a-meta")
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= page.viewport_size["width"], (page.viewport_size, width)
        desk.screenshot(path=str(artifacts / "serve-heavy-done.png"), full_page=True)
        phone.screenshot(path=str(artifacts / "serve-heavy-done-phone.png"), full_page=True)
        phone.close()

        # Stop a Heavy run while its runs search: said in words, no vote claimed
        desk.click("button[data-tab=ask]")
        desk.fill("#question", "stop: who wrote Dracula?")
        followed = desk.evaluate("location.hash")
        desk.click("#ask-btn")
        desk.wait_for_function(f"location.hash !== {followed!r}")
        desk.wait_for_function(f"({LANES_SEEN})().length === 3 && "
                               f"({LANES_SEEN})().every(([n]) => n >= 2)",
                               timeout=RUN_TIMEOUT_MS)
        desk.click("#stop-btn")
        desk.wait_for_selector("#c-status.failed", timeout=RUN_TIMEOUT_MS)
        assert desk.inner_text("#a-text") == "Stopped before the model gave an answer."
        meta = desk.inner_text("#a-meta")
        assert "vote" not in meta and "synthesised" not in meta, meta
        heads = desk.locator("#timeline > li.lane > .lane-head").all_inner_texts()
        assert all("Stopped" in h for h in heads), heads
        desk.screenshot(path=str(artifacts / "serve-heavy-stopped.png"), full_page=True)
        assert not errors, errors
        desk.close()
