// The channels page (a tenant admin's chat channel): plain JS, no build step. The channel as
// GET /api/admin/channel shows it (never a secret), a test post (POST /api/admin/channel/test),
// where decisions are made (PUT /api/admin/channel/decides), the sender map (GET, PUT and DELETE
// /api/admin/channel/senders/…) and the changes, each a chained audit record on the server.
"use strict";

function say(text) { $("#status").textContent = text; }
function refuse(text) { $("#refusal").textContent = text; }
const senderPath = (sender) => `/api/admin/channel/senders/${encodeURIComponent(sender)}`;

function showChannel(channel) {
  $("#channel").hidden = channel === null;
  $("#no-channel").hidden = channel !== null;
  for (const id of ["#test-post", "#decides", "#save-decides"]) $(id).disabled = channel === null;
  if (channel === null) return;
  $("#channel-kind").textContent = channel.kind;
  $("#channel-name").textContent = channel.name;
  $("#channel-chat").textContent = channel.chat_id || "(none: an incoming webhook posts to its own channel)";
  $("#channel-token").textContent = channel.has_bot_token ? "set (not shown)" : "none";
  $("#channel-inbound").textContent = channel.inbound ? "accepted (webhook secret set, not shown)" : "none: it only posts";
  $("#decides").value = channel.decides_up_to;
}

async function loadChannel() {
  try {
    showChannel(await api("GET", "/api/admin/channel"));
  } catch (err) {
    if (err.status !== 404) throw err;
    showChannel(null);
  }
}

async function loadSenders() {
  const { senders } = await api("GET", "/api/admin/channel/senders");
  $("#senders tbody").replaceChildren(...senders.map((s) => {
    const remove = el("button", { type: "button", text: "Remove", "aria-label": `Remove ${s.sender}` });
    remove.addEventListener("click", () => act(async () => {
      await api("DELETE", senderPath(s.sender));
      say(`Unlinked ${s.sender}`);
    }));
    return el("tr", { "data-sender": s.sender },
      el("th", { scope: "row" }, el("code", { text: s.sender })),
      el("td", { text: s.user_id }), el("td", { text: s.agent }), el("td", {}, remove));
  }));
  $("#no-senders").hidden = senders.length > 0;
}

async function loadChanges() {
  const { changes } = await api("GET", "/api/admin/channel/changes");
  $("#changes tbody").replaceChildren(...changes.map((c) => el("tr", {},
    el("td", { text: new Date(c.at).toLocaleString() }),
    el("td", { text: c.actor || "" }),
    el("td", { text: c.change || c.action }))));
}

// Run a change, then show everything as the server has it now; a refusal as the server gave it.
async function act(change) {
  refuse("");
  try {
    await change();
  } catch (err) {
    refuse(`Refused: ${err.message}`);
  }
  await Promise.all([loadChannel(), loadSenders(), loadChanges()]).catch((err) => refuse(err.message));
}

signInOut();
if ($("#channel")) {
  $("#test-post").addEventListener("click", () => act(async () => {
    say("Posting…");
    const posted = await api("POST", "/api/admin/channel/test", {});
    say(`Posted a test message to ${posted.posted_to}`);
  }));
  $("#decides-form").addEventListener("submit", (event) => {
    event.preventDefault();
    act(async () => {
      await api("PUT", "/api/admin/channel/decides", { up_to: $("#decides").value });
      say("Saved where decisions are made");
    });
  });
  $("#add-sender").addEventListener("submit", (event) => {
    event.preventDefault();
    const form = new FormData($("#add-sender"));
    act(async () => {
      await api("PUT", senderPath(form.get("sender")), { user_id: form.get("user_id"), agent: form.get("agent") });
      say(`Linked ${form.get("sender")} to ${form.get("user_id")}`);
      $("#sender").value = "";
      $("#user").value = "";
    });
  });
  act(async () => {});
}
