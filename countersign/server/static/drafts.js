// The drafts and notifications page: plain JS, no build step. Notifications from /api/notifications
// (resolve one with its button); drafts from /api/drafts, each opened to read in full and edited
// through PATCH /api/drafts/{id}. A refusal (403: not yours to edit; 409: sent, or frozen while a
// decision on it is pending) is shown in the draft itself, as the server gave it.
"use strict";

function say(text) { $("#status").textContent = text; }
const when = (iso) => new Date(iso).toLocaleString();
const REFUSED = { 403: "Not yours to edit", 404: "Gone", 409: "Cannot be edited now" };

// --- notifications -----------------------------------------------------------------------------
function notificationCard(n) {
  const node = el("li", { class: `card notification ${n.status}`, "data-id": n.id, "aria-labelledby": `n${n.id}-title` },
    el("h3", { id: `n${n.id}-title`, text: `${n.kind.replaceAll("_", " ")} · ${when(n.created_at)}` }),
    el("p", { class: "message", text: n.message }),
    el("p", { class: "error", role: "alert" }));
  if (n.workflow_id) node.append(el("p", { class: "muted", text: `conversation ${n.workflow_id}` }));
  if (n.status === "open") {
    const resolve = el("button", { type: "button", text: "Resolve", "aria-describedby": `n${n.id}-title` });
    resolve.addEventListener("click", async () => {
      try {
        const done = await api("POST", `/api/notifications/${n.id}/resolve`, {});
        say(done.changed ? `Notification ${n.id} resolved` : `Notification ${n.id} was already resolved`);
        await loadNotifications();
        $("#notifications button, #notification-status").focus();
      } catch (err) { $(".error", node).textContent = err.message; }
    });
    node.append(el("p", {}, resolve));
  } else {
    node.append(el("p", { class: "muted", text: `resolved by ${n.resolved_by || "?"} · ${n.resolved_at ? when(n.resolved_at) : ""}` }));
  }
  return node;
}

// Each list's loads are numbered: an older answer (the filter changed meanwhile) arriving last is
// dropped, so a list always shows what its filter says.
const newestLoad = { notifications: 0, drafts: 0 };

async function loadNotifications() {
  const load = ++newestLoad.notifications;
  const { notifications } = await api("GET", `/api/notifications?status=${$("#notification-status").value}`);
  if (load !== newestLoad.notifications) return;
  $("#notifications").replaceChildren(...notifications.map(notificationCard));
  $("#no-notifications").hidden = notifications.length > 0;
  $("#notification-count").textContent = `(${notifications.length})`;
}

// --- drafts ------------------------------------------------------------------------------------
function field(id, label, input) {
  return el("p", {}, el("label", { for: id, text: label }), input);
}

function editForm(draft, card) {
  const id = `d${draft.draft_id}`;
  const to = el("input", { id: `${id}-to`, name: "to", type: "email", required: true });
  const subject = el("input", { id: `${id}-subject`, name: "subject", required: true, maxlength: "200" });
  const body = el("textarea", { id: `${id}-body`, name: "body", required: true });
  to.value = draft.to; subject.value = draft.subject; body.value = draft.body;
  const sent = draft.sent_outbox_id !== null;
  for (const input of [to, subject, body]) input.readOnly = sent;
  const form = el("form", { class: "draft-edit", "aria-label": `Draft ${draft.draft_id}` },
    field(to.id, "To", to), field(subject.id, "Subject", subject), field(body.id, "Body", body),
    el("p", { class: "muted", text: `by ${draft.created_by} · created ${when(draft.created_at)} · updated ${when(draft.updated_at)}` }));
  if (sent) {
    form.append(el("p", { class: "note", text: `Sent (email ${draft.sent_outbox_id}): it can no longer be edited.` }));
    return form;
  }
  const sender = $("main").dataset.sender;
  const send = sender ? el("a", { class: "send", href: `/chat?${new URLSearchParams({ agent: sender, message: `Please send draft ${draft.draft_id} ("${draft.subject}" to ${draft.to}).` })}`,
    text: `Send it (through approval, with ${sender})` }) : "";
  form.append(el("p", {}, el("button", { type: "submit", text: "Save draft" }), send));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const changes = {};
    if (to.value !== draft.to) changes.to = to.value;
    if (subject.value !== draft.subject) changes.subject = subject.value;
    if (body.value !== draft.body) changes.body = body.value;
    const refusal = $(".refusal", card);
    refusal.textContent = "";
    if (!Object.keys(changes).length) { say(`Draft ${draft.draft_id}: nothing changed`); return; }
    try {
      const saved = await api("PATCH", `/api/drafts/${draft.draft_id}`, changes);
      Object.assign(draft, saved);
      $("h3 .subject", card).textContent = saved.subject;
      $(".to", card).textContent = `to ${saved.to}`;
      say(`Draft ${draft.draft_id} saved`);
    } catch (err) {
      refusal.textContent = `${REFUSED[err.status] || "Refused"}: ${err.message}`;
      refusal.focus();
      if (err.status === 409) { // it changed meanwhile (sent, say): show it as it is now
        const now = await api("GET", `/api/drafts/${draft.draft_id}`).catch(() => null);
        if (now) {
          form.replaceWith(editForm(now, card));
          $(".meta", card).textContent = meta(now);
        }
      }
    }
  });
  return form;
}

const meta = (d) => `${d.sent_outbox_id !== null ? "sent" : "not sent"} · by ${d.created_by} · updated ${when(d.updated_at)}${d.lead_id ? ` · lead ${d.lead_id}` : ""}`;

function draftCard(d) {
  const sent = d.sent_outbox_id !== null;
  const card = el("li", { class: `card draft ${sent ? "sent" : "unsent"}`, "data-id": d.draft_id, "aria-labelledby": `d${d.draft_id}-title` },
    el("h3", { id: `d${d.draft_id}-title` }, `Draft ${d.draft_id}: `, el("span", { class: "subject", text: d.subject })),
    el("p", { class: "to", text: `to ${d.to}` }),
    el("p", { class: "muted meta", text: meta(d) }),
    el("p", { class: "refusal error", role: "alert", tabindex: "-1" }));
  const details = el("details", {}, el("summary", { text: sent ? "Read" : "Read and edit" }));
  details.addEventListener("toggle", async () => {
    if (!details.open || $("form", details)) return;
    try {
      const draft = await api("GET", `/api/drafts/${d.draft_id}`);
      details.append(editForm(draft, card));
      $("input, textarea", details).focus();
    } catch (err) { $(".refusal", card).textContent = err.message; }
  });
  card.append(details);
  return card;
}

async function loadDrafts() {
  const load = ++newestLoad.drafts;
  const { drafts } = await api("GET", `/api/drafts?state=${$("#draft-state").value}`);
  if (load !== newestLoad.drafts) return;
  $("#drafts").replaceChildren(...drafts.map(draftCard));
  $("#no-drafts").hidden = drafts.length > 0;
}

signInOut();
if ($("#drafts")) {
  $("#notification-status").addEventListener("change", () => loadNotifications().catch((err) => say(err.message)));
  $("#draft-state").addEventListener("change", () => loadDrafts().catch((err) => say(err.message)));
  loadNotifications().catch((err) => say(err.message));
  loadDrafts().catch((err) => say(err.message));
}
