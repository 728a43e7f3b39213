// The inbox page: plain JS, no build step. Pending approvals arrive over server-sent events
// (/api/events?limit=N: the first N, soonest to expire first, and how many more wait); each card shows first what the call will do (its effect: the records it changes,
// before and after, the messages it sends as they will leave), then the parsed arguments one key
// per line (hidden characters made visible, look-alikes and bidi flagged by the server) and a form
// generated from the tool's JSON schema to edit them (the worker validates the edit again).
"use strict";

// The outcome of an action, right under the list's heading (where the decided card was), not
// below the history.
function say(text) {
  const s = $("#status");
  if (!s) return;
  s.textContent = text;
  s.scrollIntoView({ block: "nearest" });
}

// Text with `code` spans (tool descriptions are markdown): backticks become <code>, the rest
// stays text (never HTML).
function withCode(text) {
  const node = el("span");
  String(text || "").split("`").forEach((part, i) => node.append(i % 2 ? el("code", { text: part }) : part));
  return node;
}

function conversationLink(workflowId) {
  const base = $("main").dataset.workflowUrl;
  return base ? el("a", { href: base + encodeURIComponent(workflowId), target: "_blank", rel: "noopener", text: workflowId }) : workflowId;
}

signInOut();

// --- the argument form, from the tool's JSON schema ---------------------------------------------
function baseType(schema) {
  // strict-mode schemas spell optional fields as anyOf [T, null]; MCP servers' also as type [T, "null"]
  if (schema.anyOf) return schema.anyOf.find((s) => s.type !== "null") || {};
  if (Array.isArray(schema.type)) return { ...schema, type: schema.type.find((t) => t !== "null") };
  return schema;
}

function nullable(schema) {
  return Boolean(schema.anyOf) || (Array.isArray(schema.type) && schema.type.includes("null"));
}

// `optional`: a field the schema does not require (MCP tools' schemas): left empty, it is left out
// of the edited arguments instead of being sent empty.
function argField(id, name, schema, value, optional) {
  const type = baseType(schema);
  const label = el("label", { for: id, text: optional ? `${name} (optional)` : name });
  let input;
  if (type.enum) {
    input = el("select", { id, name });
    if (nullable(schema) || optional) input.append(el("option", { value: "", text: "(none)" }));
    for (const option of type.enum) {
      input.append(el("option", { value: option, text: option, selected: option === value }));
    }
  } else if (type.type === "boolean" && optional) { // unchecked would send false: offer "left out"
    input = el("select", { id, name });
    for (const [v, text] of [["", "(not given)"], ["true", "true"], ["false", "false"]]) {
      input.append(el("option", { value: v, text, selected: String(value ?? "") === v }));
    }
  } else if (type.type === "boolean") {
    input = el("input", { id, name, type: "checkbox", checked: value === true });
  } else if (type.type === "integer" || type.type === "number") {
    input = el("input", { id, name, type: "number", step: type.type === "integer" ? "1" : "any" });
    if (value !== null && value !== undefined) input.value = value;
  } else if (type.type === "string" && (name === "body" || (typeof value === "string" && value.length > 80))) {
    input = el("textarea", { id, name });
    input.value = value ?? "";
  } else if (type.type === "string") {
    input = el("input", { id, name, type: "text" });
    input.value = value ?? "";
  } else {
    input = el("textarea", { id, name, "data-json": "1" });
    input.value = value === undefined && optional ? "" : JSON.stringify(value ?? null);
  }
  input.dataset.field = name;
  input.dataset.kind = type.type || "json";
  if (nullable(schema)) input.dataset.nullable = "1";
  if (optional) input.dataset.optional = "1";
  const help = schema.description ? el("span", { class: "muted" }, withCode(schema.description)) : "";
  return el("p", {}, label, input, help);
}

function readArgs(fieldset) {
  const args = {};
  for (const input of fieldset.querySelectorAll("[data-field]")) {
    const name = input.dataset.field;
    if (input.value === "" && input.dataset.optional && input.type !== "checkbox") continue;
    if (input.type === "checkbox") args[name] = input.checked;
    else if (input.dataset.kind === "boolean") args[name] = input.value === "true";
    else if (input.value === "" && input.dataset.nullable) args[name] = null;
    else if (input.dataset.kind === "integer" || input.dataset.kind === "number") args[name] = Number(input.value);
    else if (input.dataset.json) args[name] = JSON.parse(input.value);
    else args[name] = input.value;
  }
  return args;
}

// --- cards -------------------------------------------------------------------------------------
const cards = new Map(); // key -> element

function card(item) {
  const key = `${item.workflow_id}/${item.call_id}`;
  const id = key.replace(/[^A-Za-z0-9_-]/g, "_");
  let args;
  try { args = JSON.parse(item.args); } catch { args = {}; }
  const schema = item.schema || {};
  const required = new Set(schema.required || []);
  const fields = el("fieldset", { id: `${id}-fields` }, el("legend", { text: "Arguments (edit to change what runs)" }));
  for (const [name, prop] of Object.entries(schema.properties || {})) {
    fields.append(argField(`${id}-arg-${name}`, name, prop, args[name], !required.has(name)));
  }
  const reason = el("input", { id: `${id}-reason`, name: "decision-reason", placeholder: "why (the agent is told; required to reject)" });
  const approve = el("button", { type: "button", "data-action": "approve", text: "Approve" });
  const approveEdited = el("button", { type: "button", "data-action": "approve-edited", text: "Approve with these arguments" });
  const reject = el("button", { type: "button", "data-action": "reject", text: "Reject" });
  const grantMinutes = el("input", { id: `${id}-grant-minutes`, type: "number", min: "1", max: "10080", step: "1", value: "60" });
  const grantUses = el("input", { id: `${id}-grant-uses`, type: "number", min: "1", max: "100", step: "1", value: "1" });
  const approveGranted = el("button", { type: "button", "data-action": "approve-grant", text: "Approve and grant the same again" });
  const expires = el("span", { class: "expires", "data-expires": item.expires_at, text: relativeTime(item.expires_at) });
  const messages = el("ul", { class: "messages", "aria-label": "Latest messages" });
  for (const m of item.last_messages || []) messages.append(el("li", { text: `${m.name}: ${m.content}` }));
  const node = el(
    "li",
    { class: `card risk-${item.risk}`, id: `card-${id}`, "data-key": key, "aria-labelledby": `${id}-title` },
    el("h3", { id: `${id}-title` },
      el("input", { type: "checkbox", class: "select", "aria-label": `Select ${item.tool} ${item.call_id}`, "data-key": key }),
      ` ${item.tool} `, el("small", { text: `risk ${item.risk}` })),
    el("p", { class: "muted" },
      `requested by ${item.requested_by} · agent ${item.agent} · conversation `, conversationLink(item.workflow_id),
      ` · call ${item.call_id} · expires `, expires),
    item.voided_by
      ? el("p", { class: "asked-again", role: "alert",
          text: `Asked again: what this call would do changed after ${item.voided_by} approved it`
            + (item.voided_effect ? ` (then: ${item.voided_effect.summary})` : "")
            + ", so nothing ran and that approval was voided. Decide on it as it is now." })
      : "",
    item.quorum ? el("p", { class: "quorum", role: "status", text: quorumLine(item) }) : "",
    effectView(item.effect_lines, item.effect_folds, item.effect && !item.effect.resolved, item.effect),
    (item.warnings || []).length
      ? el("ul", { class: "warnings", role: "alert", "aria-label": "Check these arguments" },
          ...item.warnings.map((w) => el("li", { text: `⚠ ${w}` })))
      : "",
    el("p", {}, withCode(item.description)),
    item.hints ? el("p", { class: "hints", text: item.hints }) : "",
    messages,
    el("p", {}, el("strong", { text: "Arguments, one per line, as the tool will receive them:" })),
    foldedLines(item.arg_lines || [], item.arg_folds, { class: "raw-args" }),
    el("details", {}, el("summary", { text: "Edit arguments" }), fields, approveEdited),
    el("p", { class: "decision" }, el("label", { for: reason.id, text: "Your reason for this decision" }), reason),
    el("p", {}, approve, reject),
    // a quorum's call is never granted (CONTRACT.md): the card says so instead of offering a button that fails
    item.approvals_required > 1 ? el("p", { class: "grant muted", text: `No grant: this call needs ${item.approvals_required} `
      + "distinct approvers, and a grant would let later calls run on one approval." }) : el("fieldset", { class: "grant" },
      el("legend", { text: "Or approve, and let the same call run again without asking" }),
      el("p", { class: "muted", text: `Later calls of ${item.tool} by ${item.requested_by} with ${item.agent}, with these `
        + "same arguments (a tool's free ones, such as a reason, aside), run unasked until the time or the uses run out, "
        + "whichever comes first; each use is audited as approved by you. Revoke it below at any time." }),
      el("p", {},
        el("label", { for: grantMinutes.id, text: "Grant minutes" }), grantMinutes, " ",
        el("label", { for: grantUses.id, text: "Grant uses" }), grantUses, " ",
        approveGranted)),
    el("p", { class: "error", role: "alert" }),
  );
  const decide = async (decision, edited, granted) => {
    const body = { decision, reason: reason.value || null };
    try {
      if (edited) body.args = readArgs(fields);
      if (granted) body.grant = { minutes: Number(grantMinutes.value), uses: Number(grantUses.value) };
      const result = await api("POST", `/api/approvals/${encodeURIComponent(item.workflow_id)}/${encodeURIComponent(item.call_id)}`, body);
      say(`${result.outcome}: ${item.tool} (${item.call_id}) in ${item.workflow_id}`);
      removeCard(key);
      loadHistory();
      if (granted) loadGrants();
    } catch (err) {
      $(".error", node).textContent = err.message;
    }
  };
  if (item.risk !== "high") me.then((who) => { if (who.roles.includes("admin")) node.append(standingAllow(item, node)); });
  approve.addEventListener("click", () => decide("approve", false));
  approveEdited.addEventListener("click", () => decide("approve", true));
  approveGranted.addEventListener("click", () => decide("approve", false, true));
  reject.addEventListener("click", () => {
    if (!reason.value.trim()) {
      $(".error", node).textContent = "Give a reason to reject: the agent is told why.";
      reason.focus();
      return;
    }
    if (confirm(`Reject ${item.tool} (${item.call_id})? The agent is told: ${reason.value.trim()}`)) decide("reject", false);
  });
  return node;
}

// An admin's standing tier change for the tenant (never for high risk: four-eyes holds there). It
// does not decide the call on the card; the server checks the role and the rule again.
const me = $("#pending") ? api("GET", "/api/me").catch(() => ({ roles: [] })) : Promise.resolve({ roles: [] });

function standingAllow(item, node) {
  const button = el("button", { type: "button", "data-action": "always-allow", text: "Always allow this tool for this agent" });
  const note = el("span", { class: "muted", text: ` ${item.tool} will run without approval in conversations of your tenant with ${item.agent} started from now on. This does not approve the call above: decide it too.` });
  button.addEventListener("click", async () => {
    if (!confirm(`Always allow ${item.tool} for ${item.agent} in your tenant? New conversations will run it without asking anyone.`)) return;
    try {
      const change = await api("POST", `/api/approvals/${encodeURIComponent(item.workflow_id)}/${encodeURIComponent(item.call_id)}/always-allow`, { confirm: true });
      say(`${change.tool} is now ${change.new_tier} for ${change.agent} (was ${change.old_tier}), set by ${change.changed_by}; this call still waits for a decision`);
      button.disabled = true;
    } catch (err) {
      $(".error", node).textContent = err.message;
    }
  });
  return el("p", { class: "standing" }, button, note);
}

function removeCard(key) {
  const node = cards.get(key);
  if (node) node.remove();
  cards.delete(key);
  updateCount();
}

function updateCount() {
  $("#count").textContent = `(${cards.size})`;
  $("#empty").hidden = cards.size > 0;
}

function quorumLine(item) {
  return `Needs ${item.approvals_required} distinct approvers (policy ${item.policy}), never the requester: ${item.quorum}`;
}

function render(items) {
  const keys = new Set(items.map((i) => `${i.workflow_id}/${i.call_id}`));
  for (const key of [...cards.keys()]) if (!keys.has(key)) removeCard(key);
  for (const item of items) {
    const key = `${item.workflow_id}/${item.call_id}`;
    if (cards.has(key)) { // keep a card a reviewer may be editing: only its quorum line moves on
      const line = $(".quorum", cards.get(key));
      if (line && item.quorum) line.textContent = quorumLine(item);
      continue;
    }
    const node = card(item);
    cards.set(key, node);
    $("#pending").append(node);
    if (decodeURIComponent(location.hash.slice(1)) === key) { // a notification's link: go to it
      node.scrollIntoView();
      $("button[data-action='approve']", node).focus();
    }
  }
  updateCount();
}

async function loadHistory() {
  const rows = await api("GET", "/api/history").catch(() => []);
  const body = $("#history tbody");
  body.replaceChildren(...rows.map((r) => el("tr", {},
    el("td", { text: new Date(r.at).toLocaleString() }),
    el("td", {}, conversationLink(r.workflow_id), ` / ${r.call_id}`),
    el("td", { text: r.tool }),
    el("td", { text: `${r.decision}${r.accepted ? "" : " (refused)"}${r.voided ? " (voided: what it would do changed before it ran; asked again)" : ""}` },
      ...(r.edited_args ? [el("div", { class: "edit", text: `edited arguments: ${JSON.stringify(r.edited_args)}${r.model_args ? ` (the model asked for ${JSON.stringify(r.model_args)})` : ""}` })] : [])),
    el("td", { text: `${r.approver} ${r.proven ? "(proven)" : "(claimed)"}`, title: r.proven ? "the inbox authenticated this person and the worker checked its proof" : "a name given without proof (names mode)" }),
    el("td", { text: r.reason || "" }),
  )));
  labelCells($("#history"));
}

// The grants this person may see (all of the tenant's for an admin; else those they made or that let
// their calls run), each live one revocable by its approver or an admin (the server checks again).
async function loadGrants() {
  const rows = await api("GET", "/api/grants").catch(() => []);
  const who = await me;
  $("#no-grants").hidden = rows.length > 0;
  $("#grants tbody").replaceChildren(...rows.map((g) => {
    const revoke = el("button", { type: "button", "data-action": "revoke", text: "Revoke" });
    revoke.addEventListener("click", async () => {
      if (!confirm(`Revoke grant ${g.id}? Later calls of ${g.tool} by ${g.requester} are asked again.`)) return;
      try {
        const done = await api("POST", `/api/grants/${g.id}/revoke`, {});
        say(`grant ${done.id} (${done.tool} for ${done.requester}) revoked by ${done.revoked_by}`);
      } catch (err) { say(err.message); }
      loadGrants();
    });
    const mayRevoke = g.state === "live" && (who.roles.includes("admin") || who.user_id === g.approver);
    return el("tr", { "data-grant": g.id },
      el("td", { text: g.id }),
      el("td", { text: g.tool }),
      el("td", { text: `${g.requester} · ${g.agent}` }),
      el("td", {}, el("code", { text: g.args })),
      el("td", { text: g.approver }),
      el("td", { text: `${g.uses_left} of ${g.uses}` }),
      el("td", { text: new Date(g.expires_at).toLocaleString() }),
      el("td", { class: "state", text: g.state === "revoked" ? `revoked by ${g.revoked_by}` : g.state }),
      el("td", {}, mayRevoke ? revoke : ""));
  }));
  labelCells($("#grants"));
}

// "Approve selected" approves each call once: it never grants the same again (a card's own button does).
const NO_BATCH_GRANT = "No grant: each call is approved once; to let the same call run again unasked, approve its card on its own with a grant";

// How many more calls wait after the cards shown; "Show more" grows the page (up to the server's
// largest), while the cards shown stay as they are.
function showMore(more, full) {
  $("#more").hidden = more === 0;
  $("#more-count").textContent = `${more} more waiting${full ? " (decide these first: this is the longest page)" : ""}.`;
  $("#show-more").hidden = full;
}

if ($("#pending")) {
  // The first page of calls (the soonest to expire first) and the count of the rest, streamed; a
  // longer page is a new stream with a larger limit (the server reads only what its streams show).
  const { page, maxPage } = $("#pending").dataset;
  let limit = Number(page);
  let events = null;
  const listen = () => {
    if (events) events.close();
    const source = new EventSource(`/api/events?limit=${limit}`);
    events = source;
    source.addEventListener("approvals", (event) => {
      const shown = JSON.parse(event.data);
      render(shown.items);
      showMore(shown.more, limit >= Number(maxPage));
      $("#live").textContent = `live · updated ${new Date().toLocaleTimeString()}`;
    });
    source.addEventListener("error", async () => {
      $("#live").textContent = "reconnecting…";
      // a refused reconnect closes the stream for good: if the session ended (logged out elsewhere,
      // password changed, expired), show the login form
      if (source.readyState === EventSource.CLOSED && (await fetch("/api/me")).status === 401) location.reload();
    });
  };
  $("#show-more").addEventListener("click", () => {
    limit = Math.min(limit + Number(page), Number(maxPage));
    listen();
  });
  listen();
  setInterval(() => {
    for (const span of document.querySelectorAll("[data-expires]")) span.textContent = relativeTime(span.dataset.expires);
  }, 1000);
  for (const button of document.querySelectorAll("[data-batch]")) {
    button.addEventListener("click", async () => {
      const items = [...document.querySelectorAll(".select:checked")].map((box) => {
        const [workflow_id, call_id] = [box.dataset.key.slice(0, box.dataset.key.lastIndexOf("/")), box.dataset.key.slice(box.dataset.key.lastIndexOf("/") + 1)];
        return { workflow_id, call_id };
      });
      if (!items.length) { say("select calls first"); return; }
      const batchReason = $("#batch-reason").value.trim();
      if (button.dataset.batch === "reject") {
        if (!batchReason) { say("give a reason to reject the selected: the agent is told why"); $("#batch-reason").focus(); return; }
        if (!confirm(`Reject ${items.length} selected call(s)? The agents are told: ${batchReason}`)) return;
      } else if (!confirm(`Approve ${items.length} selected call(s)? ${batchReason ? `The agents are told: ${batchReason}` : "No reason given (the reason box above gives one)"}. ${NO_BATCH_GRANT}`)) return;
      try {
        const results = await api("POST", "/api/approvals/batch", { decision: button.dataset.batch, reason: $("#batch-reason").value || null, items });
        for (const r of results) if (r.status === 200) removeCard(`${r.workflow_id}/${r.call_id}`);
        const failed = results.filter((r) => r.status !== 200);
        const granted = button.dataset.batch === "approve" ? `; ${NO_BATCH_GRANT}` : "";
        say(`${results.length - failed.length} decided${granted}${failed.length ? `; refused: ${failed.map((r) => `${r.call_id}: ${r.error}`).join("; ")}` : ""}`);
        loadHistory();
      } catch (err) { say(err.message); }
    });
  }
  loadHistory();
  loadGrants();
}
