// The policies page (a tenant admin's Cedar policies): plain JS, no build step. The enforced set
// (else the shadow one) from /api/policies fills the editor; Validate POSTs it to /api/policies/validate (nothing
// changes), Apply and Apply as shadow PUT it to /api/policies, and the server's rules decide (a
// refusal is shown as the server gave it). Below: the calls the shadow set would decide otherwise,
// and every attempt to apply a set.
"use strict";

function say(text) { $("#status").textContent = text; }
function refuse(text) { $("#refusal").textContent = text; }

// A decision in a few words: "forbid by no-competitors", "2 approvers by two-for-status", "tiers".
function described(d) {
  if (d.outcome === "no_match") return "tiers";
  const what = { forbid: "forbid", permit_run: "run" }[d.outcome] || `${d.approvals} approvers`;
  return `${what} by ${d.policy}`;
}

function version(id, label, set) {
  $(id).textContent = set ? `${label}: version ${set.version}, applied by ${set.appliedBy} at ${new Date(set.appliedAt).toLocaleString()}` : `${label}: none`;
}

async function load(fill) {
  const shown = await api("GET", "/api/policies");
  version("#enforced-version", "Enforced", shown.enforced);
  version("#shadow-version", "Shadow", shown.shadow);
  // the editor starts from the enforced set, else the shadow one (tried in shadow, then enforced)
  const start = shown.enforced || shown.shadow;
  if (fill && start) $("#text").value = start.text;
  $("#differences tbody").replaceChildren(...shown.differences.map((d) => el("tr", {},
    el("td", { text: new Date(d.at).toLocaleString() }),
    el("td", {}, el("code", { text: d.tool })),
    el("td", { text: d.requestedBy }),
    el("td", { text: described(d.enforced) }),
    el("td", { text: described(d.shadow) }))));
  $("#no-differences").hidden = shown.differences.length > 0;
  $("#policy-changes tbody").replaceChildren(...shown.changes.map((c) => el("tr", { class: c.accepted ? "" : "refused" },
    el("td", { text: new Date(c.at).toLocaleString() }),
    el("td", { text: c.accepted ? `${c.mode} version ${c.version}` : c.mode }),
    el("td", { text: `${c.changedBy} (${c.via})` }),
    el("td", { text: c.accepted ? "applied" : `refused: ${c.reason}` }))));
}

async function act(what) {
  say("");
  refuse("");
  const text = $("#text").value;
  try {
    if (what === "validate") {
      await api("POST", "/api/policies/validate", { text });
      say("Valid: every policy checks against this tenant's tools");
      return;
    }
    const shadow = what === "shadow";
    const applied = await api("PUT", "/api/policies", { text, shadow });
    say(`Applied as the ${shadow ? "shadow" : "enforced"} set, version ${applied.version}`);
  } catch (err) {
    refuse(`Refused: ${err.message}`);
  }
  await load(false);
}

signInOut();
if ($("#text")) {
  $("#validate").addEventListener("click", () => act("validate"));
  $("#apply").addEventListener("click", () => act("enforced"));
  $("#apply-shadow").addEventListener("click", () => act("shadow"));
  load(true).catch((err) => refuse(err.message));
}
