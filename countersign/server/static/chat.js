// The chat page: plain JS, no build step. A conversation is drawn from its events stream
// (/api/conversations/{id}/events, server-sent events), from the first event on: the model's text
// as it streams, tool calls as steps with their results (a line, and the result as the agent read
// it), approvals waiting (for whom, until when) and decided (by whom, what they changed and why),
// questions answered in place, rollbacks (and why they ended so), turns. Undo is offered for steps
// whose tool can be undone, while the conversation runs; undoing it all and ending it ask first.
// Every text from the server goes through textContent, never innerHTML.
"use strict";

function say(text) { $("#status").textContent = text; }

signInOut();

// --- one conversation ------------------------------------------------------------------------
let current = null; // {id, source, replies: Map(seq -> {node, attempt}), steps: Map(call_id -> node), ended}

// The tools whose steps can be undone (a compensation declared: tools/registry.py), from the page.
const undoable = new Set(($("#log")?.dataset.undoable || "").split(" ").filter(Boolean));

function setBusy(busy, why) {
  $("#send").disabled = busy;
  $("#state").textContent = why || "";
}

function add(node) {
  $("#log").append(node);
  node.scrollIntoView({ block: "nearest" });
  return node;
}

function replyNode(seq) {
  let reply = current.replies.get(seq);
  if (!reply) {
    reply = { node: add(el("li", { class: "assistant streaming", "data-seq": seq })), attempt: 0 };
    current.replies.set(seq, reply);
  }
  return reply;
}

function stepNode(callId) {
  return current.steps.get(callId);
}

function setOutcome(step, text, cls) {
  step.classList.remove("waiting", "done", "failed");
  if (cls) step.classList.add(cls);
  $(".outcome", step).textContent = text;
}

// A waiting call the signed-in person may decide (the server's list of who may, by role and the
// four-eyes rule; low risk for sales): approve or reject it in place, as the CLI chat can. The
// inbox decides it (a proof in the signed mode); a refusal is shown in the step.
function decideForm(data) {
  const id = `decide-${data.call_id}`.replace(/[^A-Za-z0-9_-]/g, "_");
  const reason = el("input", { id: `${id}-reason`, name: "reason", autocomplete: "off", placeholder: "required to reject" });
  const form = el("form", { class: "decide", "aria-label": `Decide ${data.tool} ${data.call_id}` },
    el("label", { for: reason.id, text: "Reason" }), reason,
    el("button", { type: "submit", value: "approve", text: "Approve" }),
    el("button", { type: "submit", value: "reject", text: "Reject" }),
    el("span", { class: "error", role: "alert" }));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const decision = event.submitter ? event.submitter.value : "approve";
    if (decision === "reject" && !reason.value.trim()) {
      $(".error", form).textContent = "give a reason to reject: the agent is told why";
      reason.focus();
      return;
    }
    try {
      await api("POST", `/api/approvals/${encodeURIComponent(current.id)}/${encodeURIComponent(data.call_id)}`,
        { decision, reason: reason.value.trim() || null });
      form.replaceWith(el("p", { class: "note", text: `You ${decision === "approve" ? "approved" : "rejected"} it` }));
    } catch (err) { $(".error", form).textContent = err.message; }
  });
  return form;
}

// A step's arguments. The event carries at most its first 2,000 characters, a longer text folded
// with its mark (countersign/db/events.py `arguments_of`): the mark is a button that reads the call's
// whole arguments from the transcript. Nothing is cut silently.
function stepArgs(data) {
  if (typeof data.args !== "string") return el("pre", { class: "args", text: JSON.stringify(data.args, null, 1) });
  const mark = data.args.lastIndexOf(" … ");
  if (mark < 0 || !/ more characters: show all$/.test(data.args)) return el("pre", { class: "args", text: data.args });
  const id = current.id;
  const showAll = el("button", { type: "button", class: "show-all", text: data.args.slice(mark + 1) });
  const pre = el("pre", { class: "args" }, data.args.slice(0, mark), showAll);
  showAll.addEventListener("click", async () => {
    try {
      const messages = await api("GET", `/api/conversations/${encodeURIComponent(id)}/transcript`);
      const call = messages.flatMap((m) => m.tool_calls || []).find((c) => c.id === data.call_id);
      if (call) pre.textContent = call.arguments;
    } catch (err) { say(err.message); }
  });
  return pre;
}

// Under each reply: was it helpful? (PUT …/ratings/{turn}: the conversation's user rates its
// replies; rating again replaces the rating). The rating held is shown pressed, also after a reload.
function rateBar(turn) {
  const comment = el("input", { name: "comment", autocomplete: "off", maxlength: "2000",
    placeholder: "Comment (optional)", "aria-label": `Comment on the reply of turn ${turn}` });
  const shown = el("span", { class: "rated", role: "status" });
  const bar = el("li", { class: "rate", "data-turn": turn, "aria-label": `Rate the reply of turn ${turn}` });
  for (const [rating, text] of [["helpful", "Helpful"], ["not_helpful", "Not helpful"]]) {
    const button = el("button", { type: "button", value: rating, "aria-pressed": "false", text });
    button.addEventListener("click", async () => {
      try {
        const rated = await api("PUT", `/api/conversations/${encodeURIComponent(current.id)}/ratings/${turn}`,
          { rating, comment: comment.value.trim() || null });
        markRating(rated);
      } catch (err) { shown.textContent = err.message; }
    });
    bar.append(button);
  }
  bar.append(comment, shown);
  return bar;
}

function markRating(rated) {
  const bar = document.querySelector(`#log .rate[data-turn="${rated.turn}"]`);
  if (!bar) return;
  for (const b of bar.querySelectorAll("button")) b.setAttribute("aria-pressed", String(b.value === rated.rating));
  $(".rated", bar).textContent = `Rated ${rated.rating === "helpful" ? "helpful" : "not helpful"}${rated.comment ? `: ${rated.comment}` : ""}`;
}

const handlers = {
  message(data) {
    add(el("li", { class: "user", text: data.text }));
    setBusy(true, "The agent is working…");
  },
  delta(data) {
    const reply = replyNode(data.seq);
    if (data.reset || data.attempt > reply.attempt) reply.node.textContent = ""; // a new attempt: drop the old text
    if (data.attempt < reply.attempt) return;
    reply.attempt = data.attempt;
    reply.node.append(document.createTextNode(data.text));
  },
  tool_call(data) {
    const reply = current.replies.get(data.seq);
    if (reply) {
      reply.node.classList.remove("streaming");
      if (!reply.node.textContent) reply.node.remove();
    }
    const step = add(el("li", { class: "step", "data-call": data.call_id },
      el("h3", { text: `Step ${data.call_id}: ${data.tool}` }),
      stepArgs(data),
      el("p", { class: "outcome", "aria-live": "polite", text: "running…" }),
      el("p", { class: "review" }),
      el("p", { class: "actions" })));
    current.steps.set(data.call_id, step);
  },
  approval(data) {
    const step = stepNode(data.call_id);
    if (!step) return;
    if (data.state === "pending" && data.decided_by) {
      // a quorum's approval short of its number: the step still waits (its countdown and link stay)
      // who approved so far, each one's reason, and how many more are needed: "1 of 2 approved (bob: …); 1 more approval needed"
      const sofar = data.quorum || `${data.decided_by} approved`;
      if (data.note && !data.quorum) $(".review", step).textContent = data.note;
      const countdown = $(".countdown", step); // the step still waits until the same deadline
      setOutcome(step, `Waiting for more approvals: ${sofar}`, "waiting");
      if (countdown) $(".outcome", step).append(" · expires ", countdown);
      say(`${data.tool}: ${sofar}`);
    } else if (data.state === "pending") {
      for (const node of step.querySelectorAll(".decide, .to-inbox")) node.remove();
      const who = (data.may_decide || []).join(", ") || "a reviewer";
      if (!$(".effect", step)) $("h3", step).after(effectView(data.effect_lines, data.effect_folds, data.resolved === false));
      setOutcome(step, `Waiting for a reviewer (${who} may decide)${data.quorum ? `. ${data.quorum}` : ""}`, "waiting");
      if (data.expires_at) {
        const countdown = el("span", { class: "countdown", "data-expires": data.expires_at, text: relativeTime(data.expires_at) });
        $(".outcome", step).append(" · expires ", countdown);
      }
      setBusy(true, `Waiting for ${who}`);
      if ((data.may_decide || []).includes($("#whoami").textContent)) {
        $(".actions", step).append(decideForm(data));
        say(`${data.tool} waits for a decision: you may decide it here`);
      } else {
        $(".actions", step).append(el("a", { class: "to-inbox", href: `/#${current.id}/${data.call_id}`, text: "Its card in the inbox" }));
        say(`${data.tool} waits for a reviewer: ${who} may decide`);
      }
    } else if (data.state === "expired") {
      for (const node of step.querySelectorAll(".decide, .to-inbox")) node.remove();
      setOutcome(step, "Nobody decided in time: not run", "failed");
    } else {
      for (const node of step.querySelectorAll(".decide, .to-inbox")) node.remove();
      const outcome = `${data.state} by ${data.decided_by}${data.grant_id ? ` (grant ${data.grant_id}: not asked again)` : ""}`;
      setOutcome(step, outcome, data.state === "approved" ? "done" : "failed");
      // what the reviewer changed of the call (from what to what) and why, or why they rejected it
      if (data.note) $(".review", step).textContent = data.note;
      const asked = $(".effect", step);
      if (data.edited && asked) { // what it showed is what the agent asked, not what runs
        asked.classList.add("superseded");
        asked.prepend(el("p", { class: "muted", text: `As the agent asked it; ${data.decided_by} changed it (below)` }));
      }
      setBusy(true, "The agent is working…");
      say(`${data.tool} ${outcome}`);
    }
  },
  question(data) {
    const step = stepNode(data.call_id);
    if (!step) return;
    setOutcome(step, "The agent asks you:", "waiting");
    const id = `answer-${data.call_id}`;
    const form = el("form", { class: "answer" },
      el("label", { for: id, text: data.question }),
      el("input", { id, name: "text", required: true, autocomplete: "off" }),
      el("button", { type: "submit", text: "Answer" }));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      try {
        await api("POST", `/api/conversations/${encodeURIComponent(current.id)}/answers/${encodeURIComponent(data.call_id)}`,
          { text: $("input", form).value });
        form.replaceWith(el("p", { class: "note", text: `You answered: ${$("input", form).value}` }));
        setBusy(true, "The agent is working…");
      } catch (err) { say(err.message); }
    });
    $(".actions", step).append(form);
    setBusy(true, "The agent asks you a question");
    say(`The agent asks: ${data.question}`);
    $("input", form).focus();
  },
  tool_result(data) {
    const step = stepNode(data.call_id);
    if (!step) return;
    const decided = step.classList.contains("done") ? `${$(".outcome", step).textContent}; ` : "";
    setOutcome(step, `${decided}${data.ok ? "done" : "did not succeed"}`, data.ok ? "done" : "failed");
    $(".answer", step)?.remove();
    if (data.summary) $(".actions", step).before(resultView(data));
    if (data.ok && undoable.has(data.tool) && !current.ended) {
      const undo = el("button", { type: "button", class: "undo-call", text: `Undo ${data.call_id}` });
      undo.addEventListener("click", () => rollback("call", data.call_id));
      $(".actions", step).append(undo);
    }
  },
  rollback(data) {
    const step = stepNode(data.call_id);
    const text = `Undo of ${data.call_id} (${data.tool}): ${data.state}${data.why ? ` (${data.why})` : ""}`;
    if (step) $(".actions", step).replaceChildren(el("p", { class: "note", text }));
    else add(el("li", { class: "note", text }));
    say(text);
  },
  turn(data) {
    const reply = replyNode(data.seq);
    reply.node.textContent = data.reply || "";
    reply.node.classList.remove("streaming");
    if (data.stop !== "completed") reply.node.classList.add("note");
    else if (!document.querySelector(`#log .rate[data-turn="${data.turn}"]`)) {
      add(rateBar(data.turn));
      const held = current.ratings.get(data.turn);
      if (held) markRating(held);
    }
    $("#undo-bar").hidden = current.ended;
    setBusy(false, `Turn ${data.turn} done`);
    say(`The agent replied: ${data.reply || ""}`);
  },
  ended() {
    if (current.ended) return; // said already (the page asked after its End; the stream says it too)
    add(el("li", { class: "note", text: "The conversation has ended." }));
    setBusy(true, "Ended");
    current.ended = true; // nothing to undo from here: its writes stand (the CLI's rollback still reaches them)
    for (const undo of document.querySelectorAll("#log .undo-call")) undo.remove();
    $("#undo-bar").hidden = true;
    $("#message").disabled = true;
    current.source.close();
  },
};

// A step's result: its line (what the transcript prints: an error's code and message, a reviewer's
// edit) and, folded, the result as the agent read it (bounded and redacted before the agent saw it).
function resultView(data) {
  let shown = data.result || "";
  try { shown = JSON.stringify(JSON.parse(shown), null, 1); } catch { /* not JSON (cut): as it is */ }
  return el("div", { class: "result" },
    el("p", { class: "result-summary", text: data.summary }),
    shown ? el("details", {}, el("summary", { text: "The result as the agent read it" }), el("pre", { text: shown })) : "");
}

function open(id, title) {
  if (current) current.source.close();
  $("#log").replaceChildren();
  $("#talk-title").textContent = title || id;
  $("#new-only").hidden = true;
  $("#message").disabled = false;
  $("#undo-bar").hidden = true;
  for (const b of document.querySelectorAll("#conversations button")) b.setAttribute("aria-current", String(b.dataset.id === id));
  // EventSource resumes by itself after a dropped connection, sending the last id it saw
  const source = new EventSource(`/api/conversations/${encodeURIComponent(id)}/events`);
  current = { id, source, replies: new Map(), steps: new Map(), ended: false, ratings: new Map() };
  const opened = current;
  api("GET", `/api/conversations/${encodeURIComponent(id)}/ratings`).then((rated) => {
    for (const r of rated) { opened.ratings.set(r.turn, r); if (current === opened) markRating(r); }
  }).catch(() => { /* not this person's to rate (an admin reading): no ratings shown */ });
  for (const [name, handle] of Object.entries(handlers)) {
    source.addEventListener(name, (event) => { if (current && current.source === source) handle(JSON.parse(event.data)); });
  }
  source.addEventListener("error", async () => {
    if (source.readyState === EventSource.CLOSED && (await fetch("/api/me")).status === 401) location.reload();
  });
}

// After this page's End: the conversation's run closes a moment later, and no event says so (the
// stream notices at its next keep-alive, seconds later), so the page asks its state until it has
// ended and shows it at once; one still finishing a step is left to the stream.
async function shownEnded(ending) {
  for (let tries = 0; tries < 40 && current === ending && !ending.ended; tries += 1) {
    const status = await api("GET", `/api/conversations/${encodeURIComponent(ending.id)}`).catch(() => null);
    if (status && status.state === "ended") { if (current === ending) handlers.ended(); return; }
    await new Promise((resolve) => { setTimeout(resolve, 250); });
  }
}

async function rollback(scope, callId) {
  try {
    await api("POST", `/api/conversations/${encodeURIComponent(current.id)}/rollback`, { scope, call_id: callId || null });
    say(`Undo requested (${scope})`);
  } catch (err) { say(err.message); }
}

function startNew() {
  if (current) current.source.close();
  current = null;
  $("#log").replaceChildren();
  $("#talk-title").textContent = "New conversation";
  $("#new-only").hidden = false;
  $("#message").disabled = false;
  $("#undo-bar").hidden = true;
  setBusy(false, "");
  $("#agent").focus();
}

// What this page sent to start a conversation, by workflow id: its name in the list until the
// server has stored that first message.
const typed = new Map();

async function loadConversations() {
  const list = await api("GET", "/api/conversations");
  // each entry tells itself apart: its first words, then its state now, when it started and with which agent
  $("#conversations").replaceChildren(...list.map((c) => {
    const started = new Date(c.created_at).toLocaleString([], { dateStyle: "medium", timeStyle: "short" });
    const about = `${c.agent}${c.key ? ` · ${c.key}` : ""}`;
    const label = c.first_message || typed.get(c.workflow_id) || `${about} · ${started}`;
    const said = [c.state, started, about].filter(Boolean).join(" · ");
    const button = el("button", { type: "button", "data-id": c.workflow_id, title: `${label}\n${said}`,
      "aria-current": String(current !== null && current.id === c.workflow_id) },
      el("span", { class: "first-words", text: label }),
      el("span", { class: "listed-state", "data-state": c.state || "", text: said }));
    button.addEventListener("click", () => open(c.workflow_id, label));
    return el("li", {}, button);
  }));
}

async function send() {
  const text = $("#message").value.trim();
  if (!text) return;
  setBusy(true, "Sending…");
  try {
    if (current) {
      await api("POST", `/api/conversations/${encodeURIComponent(current.id)}/messages`, { text });
    } else {
      const body = { agent: $("#agent").value, message: text };
      if ($("#key").value.trim()) body.key = $("#key").value.trim();
      const started = await api("POST", "/api/conversations", body);
      typed.set(started.workflow_id, text);
      open(started.workflow_id, text);
      loadConversations();
    }
    $("#message").value = "";
  } catch (err) {
    setBusy(false, "");
    say(err.message);
  }
}

if ($("#compose")) {
  $("#compose").addEventListener("submit", (event) => { event.preventDefault(); send(); });
  $("#message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); send(); }
  });
  $("#new").addEventListener("click", startNew);
  $("#undo-turn").addEventListener("click", () => rollback("turn"));
  $("#undo-all").addEventListener("click", () => {
    if (confirm("Undo everything this conversation changed? Each step that can be undone is undone.")) rollback("conversation");
  });
  $("#end").addEventListener("click", async () => {
    if (!confirm("End this conversation? Nothing more can be sent to it.")) return;
    const ending = current;
    try { await api("POST", `/api/conversations/${encodeURIComponent(ending.id)}/end`, {}); say("End requested"); }
    catch (err) { say(err.message); return; }
    await shownEnded(ending);
  });
  setInterval(() => {
    for (const span of document.querySelectorAll("[data-expires]")) span.textContent = relativeTime(span.dataset.expires);
  }, 1000);
  api("GET", "/api/agents").then((agents) => {
    // the name only (a description would widen the page past a phone's); the chosen one's description under it
    $("#agent").replaceChildren(...agents.map((a) => el("option", { value: a.name, text: a.name, title: a.description || a.name })));
    const describe = () => { $("#agent-about").textContent = agents.find((a) => a.name === $("#agent").value)?.description || ""; };
    $("#agent").addEventListener("change", describe);
    // another page's request, ready to send (the drafts page's "Send it"): the person sends it
    const asked = new URLSearchParams(location.search);
    if (asked.get("message")) {
      if (agents.some((a) => a.name === asked.get("agent"))) $("#agent").value = asked.get("agent");
      $("#message").value = asked.get("message");
      $("#message").focus();
      say(`Ready to send to ${$("#agent").value}: press Enter`);
    }
    describe();
  }).catch((err) => say(err.message));
  loadConversations().catch((err) => say(err.message));
  $("#message").focus();
}
