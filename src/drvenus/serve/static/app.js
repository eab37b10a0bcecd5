// drvenus web demo: ask, follow a run live (server-sent events), stop it, list runs, replay a
// saved trace. Every event arrives with a `view` computed by the server (drvenus.serve.view):
// this page never parses the agent's protocol nor Markdown (the server renders it, sanitised).
// Heavy mode: the events of run i carry `run: i`; each run gets its own lane of step cards, in
// run order, and the final answer's events (no `run`) go to a last lane, the synthesis or vote.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { config: null, runId: null, source: null, last: -1, startTime: null,
                finished: false, timer: null, replay: null, answer: "", decision: null };

// ------------------------------------------------------------------ small DOM helpers
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function link(url, text) {
  const safe = /^https?:\/\//i.test(url || "");
  return safe ? el("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, text || url)
              : el("span", {}, text || url || "");
}

// Markdown arrives rendered by the server (markdown-it + the nh3 sanitiser, drvenus.serve.markdown)
// as `view.html`: the only HTML this page inserts; any other text goes in through textContent
function rich(html, text) {
  const box = el("div", { class: "md" });
  if (html) box.innerHTML = html;
  else box.textContent = text || "";
  return box;
}

const TERMINATIONS = {
  answered: "Answered",
  answered_token_limit: "Answered when the token budget ran out",
  answered_max_steps: "Answered at the step limit",
  max_steps: "Step limit reached without an answer",
  token_limit_no_answer: "Token budget ran out without an answer",
  timeout: "Time limit reached",
  llm_error: "The model could not be reached",
  tool_error: "The tools could not be used (tool server down or refusing the token)",
  exception: "The run failed with an error",
  interrupted: "Stopped",
};
const NO_ANSWER = {  // what the answer box says when a run ends without one (not a raw name)
  interrupted: "Stopped before the model gave an answer.",
  llm_error: "The model server is not answering, so the research could not go on.",
};
const FORCED_NOTE = "Forced answer: the step or token budget ran out before the model answered " +
  "on its own, so it was asked for its best answer from what it had found. Check the sources.";

const STATUSES = {  // a run not over yet, or one whose server stopped mid-run
  queued: "Waiting for a free slot",
  running: "Researching",
  lost: "Lost (the server stopped during the run)",
};
const ORIGINS = { page: "this page", v1: "the OpenAI-compatible API (/v1)", mcp: "an MCP client" };

function runStatus(run) {
  return run.termination ? inWords(run.termination) : STATUSES[run.status] || run.status;
}

function inWords(termination) {
  return TERMINATIONS[termination] || String(termination || "").replace(/_/g, " ");
}

function counted(n, noun) {
  return `${n} ${n === 1 ? noun : noun + "s"}`;
}

function flash(message) {
  const box = $("flash");
  box.textContent = message || "";
  box.hidden = !message;
}

async function api(path, options) {
  const init = Object.assign({ headers: {} }, options || {});
  if (init.body !== undefined) init.headers["Content-Type"] = "application/json";
  const response = await fetch(path, init);
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const err = new Error((body && body.error) || `${response.status} ${response.statusText}`);
    err.status = response.status;
    err.code = (body && body.code) || null;
    throw err;
  }
  return body;
}

// ------------------------------------------------------------------ the run view
function resetView(question) {
  $("view").hidden = false;
  $("timeline").replaceChildren();
  $("timeline").classList.remove("live");
  state.decision = null;
  $("answer").hidden = true;
  $("a-text").replaceChildren();
  $("a-sources").replaceChildren();
  $("a-meta").textContent = "";
  $("a-downloads").hidden = true;
  state.answer = "";
  $("v-question").textContent = question || "";
  $("v-meta").textContent = "";
  setCounters({ steps: 0, tokens: 0, seconds: 0 });
  $("c-tokens-box").hidden = false;
  $("c-time-box").hidden = false;
  setStatus("");
  state.startTime = null;
  stopTimer();
  $("jump").hidden = true;
}

function setCounters({ steps, tokens, seconds }) {
  if (steps !== undefined) $("c-steps").textContent = steps;
  if (tokens !== undefined && tokens !== null) $("c-tokens").textContent = tokens;
  if (seconds !== undefined && seconds !== null) $("c-time").textContent = `${seconds.toFixed(1)} s`;
}

function setStatus(text, kind) {
  const pill = $("c-status");
  pill.textContent = text;
  pill.hidden = !text;
  pill.className = "pill" + (kind ? " " + kind : "");
}

function startTimer() {
  stopTimer();
  state.timer = setInterval(() => {
    if (state.startTime) setCounters({ seconds: Math.max(0, Date.now() / 1000 - state.startTime) });
  }, 200);
}

function stopTimer() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
}

function stepCount() {
  return document.querySelectorAll("#timeline li.step").length;  // the counter counts the cards
}

// the lane of Heavy mode's run `run` (its own list of step cards), made on its first event
function runLane(run) {
  const lanes = [...$("timeline").querySelectorAll(":scope > li.lane")];
  let lane = lanes.find((li) => li.dataset.run === String(run));
  if (!lane) {
    lane = el("li", { class: "lane", "data-run": run },
              el("div", { class: "lane-head" }, el("b", {}, `Run ${run + 1}`),
                 el("span", { class: "meta lane-status" }, " · researching")),
              el("ol", { class: "timeline" }));
    const after = lanes.find((li) => li.classList.contains("decision") || Number(li.dataset.run) > run);
    $("timeline").insertBefore(lane, after || null);
    fitLanes();
  }
  return lane;
}

// Following a live Heavy run (#timeline.live): each run's steps scroll in a box of their own,
// kept at its latest step, and the boxes are sized so that every lane is on screen at once
// (side by side where there is room, else one under the other); the whole lanes come back
// when the research ends
function fitLanes() {
  const timeline = $("timeline");
  const lanes = timeline.querySelectorAll(":scope > li.lane:not(.decision)");
  if (!lanes.length) return;
  const tracks = getComputedStyle(timeline).gridTemplateColumns.split(" ")
    .filter((w) => parseFloat(w) > 0).length || 1;
  const rows = Math.ceil(lanes.length / tracks);
  const bar = document.querySelector(".top").offsetHeight;
  const head = lanes[0].querySelector(".lane-head").offsetHeight + 30;  // and the lane's margins
  const height = (window.innerHeight - bar - 16) / rows - head;
  timeline.style.setProperty("--lane-h", `${Math.max(150, Math.floor(height))}px`);
}

function atLaneEnd(list) {
  return list.scrollHeight - list.scrollTop - list.clientHeight < 40;
}

function laneOf(ev) {
  if (Number.isInteger(ev.run)) return runLane(ev.run).querySelector("ol");
  return state.decision ? state.decision.querySelector("ol") : $("timeline");
}

function stepBox(ev) {
  const list = laneOf(ev);
  let box = list.querySelector(`:scope > li[data-step="${ev.step}"]`);
  if (!box) {
    const title = list === $("timeline") || Number.isInteger(ev.run) ? `Step ${ev.step + 1}` : "Final answer";
    box = el("li", { class: "step", "data-step": ev.step }, el("h4", {}, title));
    list.append(box);
    setCounters({ steps: stepCount() });
  }
  return box;
}

function dropEmptySteps(root) {  // a step stopped before it did anything
  for (const card of [...root.querySelectorAll("li.step")]) {
    if (card.children.length < 2) card.remove();
  }
  setCounters({ steps: stepCount() });
}

function lastTool(box) {
  const tools = box.querySelectorAll(".tool");
  return tools.length ? tools[tools.length - 1] : box;
}

const renderers = {
  started(ev, v) {
    if (v.heavy) {  // Heavy mode's decision, after its runs
      const how = v.heavy_mode === "vote" ? `Majority vote over ${v.heavy} runs`
                                          : `Synthesis of ${v.heavy} runs`;
      state.decision = el("li", { class: "lane decision" },
                          el("div", { class: "lane-head" }, el("b", {}, how)),
                          el("ol", { class: "timeline" }));
      $("timeline").append(state.decision);
      return;
    }
    if (Number.isInteger(ev.run)) {
      runLane(ev.run);
      if (ev.run > 0) return;  // the question and the limits are run 1's too
    }
    $("v-question").textContent = v.question;
    const parts = [v.model, v.max_steps && `${v.max_steps} steps`,
                   v.max_context_tokens && `${v.max_context_tokens} token budget`];
    $("v-meta").textContent = parts.filter(Boolean).join(" · ");
    if (ev.time) state.startTime = ev.time;
    if (!state.replay && v.max_steps) $("opt-steps").value = v.max_steps;  // this run's limit
  },
  step_started(ev, v) {
    const box = stepBox(ev);
    if (Number.isInteger(ev.run)) {
      runLane(ev.run).querySelector(".lane-status").textContent = ` · researching, step ${ev.step + 1}`;
    }
    if (Number.isInteger(state.maxSteps) && state.maxSteps > 0 && ev.step >= state.maxSteps) {
      box.querySelector("h4").textContent = "Final answer (step limit)";
    }
    setCounters({ tokens: v.context_tokens });
  },
  model_output(ev, v) {
    if (!v.thinking) return;
    const box = stepBox(ev);
    box.append(el("details", { class: "thinking" }, el("summary", {}, "Thinking"),
                  rich(v.html, v.thinking)));
  },
  tool_call(ev, v) {
    const box = stepBox(ev);
    if (v.name === "search") {
      box.append(el("div", { class: "tool search" }, el("div", { class: "label" }, "Search"),
                    el("div", {}, ...v.queries.map((q) => el("span", { class: "chip" }, q)))));
    } else {
      box.append(el("div", { class: "tool visit" }, el("div", { class: "label" }, "Visit"),
                    el("div", {}, ...v.urls.map((u) => el("div", {}, link(u)))),
                    v.goal ? el("div", { class: "meta" }, `Goal: ${v.goal}`) : null));
    }
  },
  tool_result(ev, v) {
    const target = lastTool(stepBox(ev));
    if (v.results) {
      for (const entry of v.results) {
        const items = entry.hits.map((hit) => el("li", {}, link(hit.url, hit.title || hit.url),
          hit.snippet ? el("span", { class: "snippet" }, hit.snippet) : null));
        if (v.results.length > 1) target.append(el("div", { class: "meta" }, entry.query));
        target.append(items.length ? el("ul", { class: "hits" }, ...items)
                                   : el("div", { class: "notice" }, "No results"));
      }
    } else if (v.pages) {
      for (const page of v.pages) {
        const evidence = page.failed ? null : el("details", {}, el("summary", {}, "Evidence"),
          el("p", { class: "evidence" }, page.evidence || page.summary));
        const many = v.pages.length > 1 || page.failed;  // one page: its URL is just above
        target.append(el("div", { class: "page" + (page.failed ? " failed" : "") },
          many ? link(page.url) : null,
          el("div", {}, page.failed ? "Could not be read" : page.summary),
          evidence));
      }
    } else {
      target.append(el("div", { class: "warn" }, v.text));
    }
  },
  error(ev, v) {
    const kind = (v.kind || "error").replace(/_/g, " ");
    const what = v.last ? `${kind}, no more attempts` : `${kind}, trying again`;
    stepBox(ev).append(el("div", { class: "warn", title: v.message || "" }, "↻ " + what,
      v.message ? el("span", { class: "meta" }, ` — ${v.message}`) : null));
  },
  format_error(ev, v) {
    stepBox(ev).append(el("div", { class: "notice" }, "The turn could not be used: " + v.notice));
  },
  limit_notice(ev, v) {
    const box = stepBox(ev);
    box.querySelector("h4").textContent = "Final answer";
    const what = v.reason === "context" ? "Context budget" : "Step limit";
    box.append(el("div", { class: "notice", title: v.notice },
                  `${what} reached: answering with what was found.`));
  },
  compaction(ev, v) {
    const how = v.report != null ? "restarted from its own report"
      : `${v.elided} older tool result(s) stubbed` + (v.dropped ? `, ${v.dropped} round(s) dropped` : "");
    const box = stepBox(ev);
    box.append(el("div", { class: "notice compaction" },
                  `Context compacted (${v.strategy}): ${how}; ${v.tokens_before} → ${v.tokens_after} tokens`));
    if (v.report != null) {
      box.append(el("details", { class: "thinking" }, el("summary", {}, "Report"),
                    el("p", { class: "evidence" }, v.report)));
    }
    setCounters({ tokens: v.tokens_after });
  },
  answer(ev, v) {
    if (Number.isInteger(ev.run)) return;  // a run's answer: its lane says it when it ends
    showAnswer({ answered: true, prediction: v.answer, html: v.html, forced: v.forced });
  },
  finished(ev, v) {
    if (Number.isInteger(ev.run)) {  // one of Heavy mode's runs ended
      const lane = runLane(ev.run);
      dropEmptySteps(lane);
      // a short plain header; the run's whole answer, rendered, closes its lane
      lane.querySelector(".lane-status").textContent = " · " + inWords(v.termination) +
        (v.answered ? `: ${v.headline || ""}` : "");
      lane.classList.toggle("failed", !v.answered);
      if (v.answered && v.headline !== v.prediction) {
        lane.querySelector("ol").append(el("li", { class: "lane-answer" },
          el("details", { class: "thinking" }, el("summary", {}, "Run's answer"),
             rich(v.html, v.prediction))));
      }
      return;
    }
    dropEmptySteps($("timeline"));
    $("timeline").classList.remove("live");  // the research is over: the lanes in full
    showAnswer(Object.assign({ forced: $("a-forced").hidden === false }, v));
    setCounters({ tokens: v.final_token_count, seconds: v.elapsed_seconds });
    setStatus(inWords(v.termination), v.answered ? "done" : "failed");
    stopTimer();
    if (!state.replay) {
      $("jump").hidden = true;
      $("answer").scrollIntoView({ behavior: "smooth", block: "start" });
    }
  },
};

function showAnswer(v) {
  const box = $("answer");
  box.hidden = false;
  box.classList.toggle("failed", !v.answered);
  box.querySelector("h3").firstChild.textContent = v.answered ? "Answer " : "No answer ";
  box.classList.toggle("forced", Boolean(v.answered && v.forced));
  $("a-forced").hidden = !v.forced;
  $("a-forced-note").hidden = !v.forced;
  $("a-forced-note").textContent = FORCED_NOTE;
  const reason = NO_ANSWER[v.termination] ||
    (v.error && v.error !== v.termination ? v.error : v.prediction || inWords(v.termination));
  $("a-text").replaceChildren(v.answered ? rich(v.html, v.prediction) : rich(null, reason));
  state.answer = v.answered ? String(v.prediction || "") : "";
  $("copy-btn").hidden = !state.answer;
  $("copy-btn").textContent = "Copy";
  const sources = $("a-sources");
  if (v.sources === undefined) return;
  sources.replaceChildren(v.sources.length
    ? el("div", {}, el("b", {}, "Sources visited"),
         el("ul", { class: "sources" }, ...(v.source_pages || v.sources.map((url) => ({ url })))
           .map((p) => el("li", {}, link(p.url, p.title || p.url)))))
    : el("div", { class: "meta" }, "No page was visited."));
  const parts = [inWords(v.termination), counted(v.tool_call_count, "tool call"),
                 counted(v.turns, "turn")];
  if (v.heavy) {
    parts.push(`${v.heavy.runs} runs, ${v.heavy.how}`);
  }
  if (v.tokens_used > 0) parts.push(`${v.tokens_used} tokens used`);
  if (v.elapsed_seconds > 0) parts.push(`${v.elapsed_seconds.toFixed(1)} s`);
  $("a-meta").textContent = parts.join(" · ");
  // the run's report (Markdown, sources by title) and trace (JSONL) to take away
  const id = state.replay ? null : state.runId;
  const downloads = $("a-downloads");
  downloads.hidden = !id;
  if (id) {
    const base = `/api/runs/${encodeURIComponent(id)}`;
    downloads.replaceChildren("Download: ",
      el("a", { href: `${base}/report`, download: `drvenus-${id}.md` }, "report (Markdown)"), " · ",
      el("a", { href: `${base}/trace`, download: `drvenus-${id}.jsonl` }, "trace (JSONL)"));
  }
}

function render(ev) {
  if (ev.type === "started") state.maxSteps = ev.view.max_steps;
  const fn = renderers[ev.type];
  if (fn) fn(ev, ev.view || {});
}

// ------------------------------------------------------------------ following a live run
// While the reader is at the bottom, new steps scroll into view; once they scroll up to read,
// the page stays put and offers "Jump to latest" instead.
function atBottom() {
  const doc = document.documentElement;
  return window.innerHeight + window.scrollY >= doc.scrollHeight - 60;
}

function toBottom() {
  window.scrollTo({ top: document.documentElement.scrollHeight });
  $("jump").hidden = true;
}

function renderLive(ev) {
  const following = atBottom();
  const lane = Number.isInteger(ev.run) ? runLane(ev.run).querySelector("ol") : null;
  const laneFollowing = lane && atLaneEnd(lane);  // unless its reader scrolled up in it
  if (lane) $("timeline").classList.add("live");
  render(ev);
  if (laneFollowing) lane.scrollTop = lane.scrollHeight;
  if (ev.type === "finished") return;  // the answer scrolls itself into view
  if (following) toBottom();
  else if (!atBottom()) $("jump").hidden = false;
}

async function copyAnswer() {
  const text = state.answer;
  try {
    await navigator.clipboard.writeText(text);
  } catch (e) {  // no clipboard API (an insecure origin): the old way
    const area = el("textarea", {}, text);
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  $("copy-btn").textContent = "Copied";
}

// ------------------------------------------------------------------ live runs
async function follow(runId, question) {
  closeStream();
  state.runId = runId;
  state.last = -1;
  state.finished = false;
  resetView(question);
  setStatus("connecting");
  if (location.hash !== "#run=" + encodeURIComponent(runId)) {
    location.hash = "run=" + encodeURIComponent(runId);
  }
  try {
    const run = await api(`/api/runs/${encodeURIComponent(runId)}`);
    if (state.runId !== runId) return;
    if (!$("question").value) $("question").value = run.question || "";  // after a reload
    if (!question) $("v-question").textContent = run.question || "";
  } catch (err) {
    if (state.runId !== runId) return;
    state.finished = true;
    const unknown = err.code === "run_not_found" || err.status === 404;
    setStatus(unknown ? "no such run on this server" : "cannot open this run", "failed");
    flash(unknown
      ? "This server has no run with that id: check the link, or pick a run under Runs."
      : `Cannot open that run: ${err.message}`);
    return;
  }
  connect();
}

function followHash() {
  // run links, Back and Forward: the page follows the run its address names
  const match = /run=([^&]+)/.exec(location.hash);
  const runId = match ? decodeURIComponent(match[1]) : null;
  if (runId && runId !== state.runId) { stopReplay(); showTab("ask"); follow(runId, ""); }
}

function connect() {
  const runId = state.runId;
  const source = new EventSource(`/api/runs/${encodeURIComponent(runId)}/events?after=${state.last}`);
  state.source = source;
  source.addEventListener("run", (msg) => {
    const run = JSON.parse(msg.data);
    if (!run.events && run.status !== "done") setStatus(run.status);
    if (run.status === "queued") setStatus("waiting for a free slot");
    else if (run.status === "running") { setStatus("running"); startTimer(); }
    const over = run.status === "done" || run.status === "lost";
    $("stop-btn").hidden = over;
    $("ask-btn").disabled = !over;  // one run at a time from this page, after a reload too
  });
  source.addEventListener("trace", (msg) => {
    const ev = JSON.parse(msg.data);
    if (ev.i <= state.last) return;
    state.last = ev.i;
    renderLive(ev);
    if (ev.type === "started" && !state.finished) { setStatus("running"); startTimer(); }
  });
  source.addEventListener("end", (msg) => {
    const run = JSON.parse(msg.data);
    state.finished = true;
    source.close();
    stopTimer();
    $("timeline").classList.remove("live");
    $("stop-btn").hidden = true;
    $("ask-btn").disabled = false;
    if (run.status === "lost") setStatus("lost (the server stopped during the run)", "failed");
  });
  source.onerror = () => {
    source.close();
    if (state.finished || state.runId !== runId) return;
    setStatus("reconnecting…");
    setTimeout(() => { if (state.runId === runId && !state.finished) connect(); }, 1500);
  };
}

function closeStream() {
  if (state.source) state.source.close();
  state.source = null;
  stopTimer();
}

async function ask(event) {
  event.preventDefault();
  const question = $("question").value.trim();
  if (!question) { flash("Type a question to research."); $("question").focus(); return; }
  flash("");
  const body = { question, model: $("opt-model").value || null, tools: $("opt-tools").value || null };
  const field = $("opt-steps");
  const steps = parseInt(field.value, 10);
  if (field.value !== "" && !field.checkValidity()) {
    // the field sits in the (maybe closed) settings panel: open it and say what is wrong
    $("settings").open = true;
    flash(`Step limit: give a whole number from ${field.min} to ${field.max}.`);
    field.focus();
    return;
  }
  if (!Number.isNaN(steps)) body.max_steps = steps;
  const runs = $("opt-heavy");
  if (!runs.closest("label").hidden) {
    if (runs.value !== "" && !runs.checkValidity()) {
      $("settings").open = true;
      flash(`Heavy runs: give a whole number from ${runs.min} to ${runs.max}.`);
      runs.focus();
      return;
    }
    const heavy = parseInt(runs.value, 10);
    if (!Number.isNaN(heavy)) body.heavy = heavy;
  }
  $("ask-btn").disabled = true;
  try {
    const run = await api("/api/runs", { method: "POST", body: JSON.stringify(body) });
    stopReplay();
    follow(run.id, question);
    $("stop-btn").hidden = false;
  } catch (err) {
    flash(err.message);
    $("ask-btn").disabled = false;
  }
}

async function stop() {
  if (!state.runId) return;
  try {
    await api(`/api/runs/${encodeURIComponent(state.runId)}/cancel`, { method: "POST", body: "{}" });
  } catch (err) { flash(err.message); }
}

async function loadRuns() {
  const list = $("run-list");
  try {
    const { runs, all } = await api("/api/runs");
    list.replaceChildren(...runs.map((run) => {
      const when = new Date(run.created * 1000).toLocaleString();
      const origin = all ? ` · from ${ORIGINS[run.origin] || run.origin}` : "";
      const item = el("li", {}, el("div", { class: "q" }, run.question || "(no question)"),
        el("div", { class: "meta" }, `${when} · ${runStatus(run)}${origin}`));
      item.addEventListener("click", () => { stopReplay(); showTab("ask"); follow(run.id, run.question); });
      return item;
    }));
    if (!runs.length) {
      list.replaceChildren(el("li", { class: "meta" },
        all ? "No runs yet." : "No runs of yours yet: runs you start from this browser are listed here."));
    }
  } catch (err) { flash(err.message); }
}

// ------------------------------------------------------------------ replay
async function openReplay() {
  const file = $("replay-file").files[0];
  if (!file) return;
  flash("");
  try {
    const text = await file.text();
    const { runs } = await api("/api/replay", { method: "POST", body: JSON.stringify({ text }) });
    const select = $("replay-select");
    select.replaceChildren(...runs.map((r, i) => el("option", { value: i },
      `${i + 1}. ${(r.question || "(no question)").slice(0, 80)}`)));
    $("replay-pick").hidden = runs.length < 2;
    state.replay = { runs, events: [], pos: 0, playing: null };
    pickReplay(0);
  } catch (err) {
    // nothing of an earlier replay stays on screen under the error
    stopReplay();
    $("view").hidden = true;
    const reason = err.message.replace(/^cannot replay this file:\s*/i, "");
    flash(`Cannot replay ${file.name}: ${reason}`);
  }
}

function pickReplay(index) {
  closeStream();
  state.runId = null;
  history.replaceState(null, "", location.pathname);
  const r = state.replay;
  r.events = r.runs[index].events.filter((ev) => ev.type !== "turn");
  $("player").hidden = false;
  seek(Math.min(1, r.events.length));
}

function seek(pos) {
  const r = state.replay;
  r.pos = Math.max(0, Math.min(pos, r.events.length));
  resetView("");
  setStatus("replay");
  const shown = r.events.slice(0, r.pos);
  const start = shown.length ? shown[0].time : 0;
  for (const ev of shown) render(ev);
  const last = shown[shown.length - 1];
  if (last && last.type !== "finished" && start && last.time) {
    setCounters({ seconds: Math.max(0, last.time - start) });
  }
  // a file without timings or token counts (results rebuilt from messages): say nothing
  const timed = r.events.some((ev) => ev.time);
  const hasTokens = r.events.some((ev) => (ev.view || {}).context_tokens ||
                                         (ev.view || {}).final_token_count);
  $("c-time-box").hidden = !timed;
  $("c-tokens-box").hidden = !hasTokens;
  $("rp-pos").textContent = `${r.pos} / ${r.events.length}`;
}

function togglePlay() {
  const r = state.replay;
  if (!r) return;
  if (r.playing) { stopReplayTimer(); return; }
  if (r.pos >= r.events.length) seek(0);
  $("rp-play").textContent = "Pause";
  r.playing = setInterval(() => {
    if (r.pos >= r.events.length) { stopReplayTimer(); return; }
    seek(r.pos + 1);
  }, 700);
}

function stopReplayTimer() {
  const r = state.replay;
  if (r && r.playing) clearInterval(r.playing);
  if (r) r.playing = null;
  $("rp-play").textContent = "Play";
}

function stopReplay() {
  stopReplayTimer();
  state.replay = null;
  $("player").hidden = true;
}

// ------------------------------------------------------------------ setup
function showTab(name) {
  for (const button of document.querySelectorAll(".tabs button")) {
    button.classList.toggle("active", button.dataset.tab === name);
    button.setAttribute("aria-selected", String(button.dataset.tab === name));
  }
  for (const tab of ["ask", "runs", "replay"]) $("tab-" + tab).hidden = tab !== name;
  // the run view belongs to Ask (a live or finished run) and Replay (the file): not to Runs
  $("view").hidden = !((name === "ask" && state.runId) || (name === "replay" && state.replay));
  window.scrollTo({ top: 0 });
  if (name === "runs") loadRuns();
}

function fillSelect(select, items) {
  select.replaceChildren(...items.map((item) => el("option", { value: item.id }, item.label)));
  select.disabled = items.length < 2;
}

async function init() {
  for (const button of document.querySelectorAll(".tabs button")) {
    button.addEventListener("click", () => showTab(button.dataset.tab));
  }
  $("ask-form").addEventListener("submit", ask);
  $("question").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("ask-form").requestSubmit(); }
  });
  $("stop-btn").addEventListener("click", stop);
  $("replay-file").addEventListener("change", openReplay);
  $("replay-select").addEventListener("change", (e) => pickReplay(parseInt(e.target.value, 10)));
  $("rp-first").addEventListener("click", () => { stopReplayTimer(); seek(0); });
  $("rp-prev").addEventListener("click", () => { stopReplayTimer(); seek(state.replay.pos - 1); });
  $("rp-next").addEventListener("click", () => { stopReplayTimer(); seek(state.replay.pos + 1); });
  $("rp-all").addEventListener("click", () => { stopReplayTimer(); seek(state.replay.events.length); });
  $("rp-play").addEventListener("click", togglePlay);
  $("jump").addEventListener("click", toBottom);
  $("copy-btn").addEventListener("click", copyAnswer);
  window.addEventListener("scroll", () => { if (atBottom()) $("jump").hidden = true; });
  try {
    state.config = await api("/api/config");
    fillSelect($("opt-model"), state.config.models);
    showAbout();
    $("opt-model").addEventListener("change", () => { showAbout(); showSteps(); });
    fillSelect($("opt-tools"), state.config.tools);
    $("opt-steps").value = state.config.max_steps;
    $("opt-steps").max = state.config.step_cap;
    $("opt-heavy").value = state.config.heavy || 1;
    $("opt-heavy").max = state.config.heavy_cap || 1;
    $("opt-heavy").closest("label").hidden = !(state.config.heavy_cap > 1);
    if (state.config.problem) flash(`Research will fail for now: ${state.config.problem}.`);
  } catch (err) { flash("Cannot reach the server: " + err.message); }
  window.addEventListener("hashchange", followHash);
  window.addEventListener("resize", fitLanes);
  followHash();
}

function showSteps() {
  // the chosen model's own step limit (the embedded model: 4; a real model: 200)
  const id = $("opt-model").value;
  const model = (state.config.models || []).find((m) => m.id === id);
  if (model && model.max_steps) $("opt-steps").value = model.max_steps;
}

function showAbout() {
  // what the chosen model is and can do, in the server's own words
  const id = $("opt-model").value;
  const model = (state.config.models || []).find((m) => m.id === id) || state.config.models[0];
  const box = $("model-about");
  box.textContent = (model && model.about) || "";
  box.hidden = !box.textContent;
}

init();
