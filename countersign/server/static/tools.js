// The tools page (a tenant admin's tier panel): plain JS, no build step. For the chosen agent, its
// tools from /api/agents/{agent}/tools/catalog (risk, category, whether it can be undone) beside the
// tenant's tiers from /api/agents/{agent}/tools; "Save tiers" PUTs every tool's tier back, and the
// server's rules decide (a refusal is shown as the server gave it). The changes are tier_changes.
"use strict";

const TIERS = [["always_allow", "always allow"], ["needs_approval", "needs approval"], ["blocked", "blocked"]];

function say(text) { $("#status").textContent = text; }
function refuse(text) { $("#refusal").textContent = text; }
const agentPath = () => `/api/agents/${encodeURIComponent($("#agent").value)}/tools`;

function tierSelect(tool) {
  const id = `tier-${tool.toolName}`.replace(/[^A-Za-z0-9_-]/g, "_");
  const select = el("select", { id, "data-tool": tool.toolName, "data-saved": tool.tier });
  for (const [value, text] of TIERS) {
    const never = value === "always_allow" && tool.risk === "high"; // the rule the server holds too
    select.append(el("option", { value, text: never ? `${text} (never for high risk)` : text, selected: value === tool.tier, disabled: never && value !== tool.tier }));
  }
  select.addEventListener("change", markUnsaved);
  return el("td", {}, el("label", { for: id, class: "visually-hidden", text: `Tier of ${tool.toolName}` }), select,
    tool.tier === tool.defaultTier ? "" : el("span", { class: "muted", text: ` (agent's default: ${tool.defaultTier.replace("_", " ")})` }));
}

// A tool's description is wrapped over lines: its first sentence, on one line.
function firstSentence(text) {
  const flat = text.replace(/\s+/g, " ").trim();
  const end = flat.search(/[.](\s|$)/);
  return end < 0 ? flat : flat.slice(0, end + 1);
}

function markUnsaved() {
  const changed = [...document.querySelectorAll("#tools select")].filter((s) => s.value !== s.dataset.saved);
  $("#unsaved").textContent = changed.length ? `${changed.length} change(s) not saved yet` : "";
}

// Each load is numbered: when the agent changes while an earlier agent's lists are still on their
// way, only the newest load may fill the table (an older answer arriving last would show, and then
// save, another agent's tools).
let newestLoad = 0;

async function loadTools() {
  refuse("");
  const load = ++newestLoad;
  const [catalog, tiers] = await Promise.all([api("GET", `${agentPath()}/catalog`), api("GET", agentPath())]);
  if (load !== newestLoad) return;
  const tierOf = new Map(tiers.tools.map((t) => [t.toolName, t.permissionStatus]));
  $("#tools tbody").replaceChildren(...catalog.tools.map((tool) => {
    const row = { ...tool, tier: tierOf.get(tool.toolName) || tool.defaultTier };
    return el("tr", { "data-tool": tool.toolName, "data-risk": tool.risk },
      el("th", { scope: "row" }, el("code", { text: tool.toolName }),
        tool.description ? el("div", { class: "muted", text: firstSentence(tool.description) }) : ""),
      el("td", { class: "risk", text: tool.risk }),
      el("td", { text: tool.category }),
      el("td", { text: tool.reversible ? "yes" : "no" }),
      tierSelect(row));
  }));
  labelCells($("#tools"));
  markUnsaved();
  await loadChanges();
}

async function loadChanges() {
  const load = newestLoad;
  const { changes } = await api("GET", `${agentPath()}/changes`);
  if (load !== newestLoad) return;
  $("#changes tbody").replaceChildren(...changes.map((c) => el("tr", { class: c.accepted ? "" : "refused" },
    el("td", { text: new Date(c.createdAt).toLocaleString() }),
    el("td", {}, el("code", { text: c.toolName })),
    el("td", { text: (c.oldTier || "(not granted)").replace("_", " ") }),
    el("td", { text: c.newTier.replace("_", " ") }),
    el("td", { text: `${c.changedBy} (${c.via})` }),
    el("td", { text: c.accepted ? "changed" : `refused: ${c.reason}` }))));
  labelCells($("#changes"));
  $("#no-changes").hidden = changes.length > 0;
}

async function save(event) {
  event.preventDefault();
  refuse("");
  const tools = [...document.querySelectorAll("#tools select")].map((s) => ({ toolName: s.dataset.tool, permissionStatus: s.value }));
  const changed = [...document.querySelectorAll("#tools select")].filter((s) => s.value !== s.dataset.saved).length;
  try {
    await api("PUT", agentPath(), { tools });
    say(changed ? `Saved ${changed} change(s) for ${$("#agent").value}` : "Nothing to change");
    await loadTools();
  } catch (err) {
    refuse(`Refused: ${err.message}`);
    await loadChanges(); // a refused attempt is recorded too
  }
}

signInOut();
if ($("#tiers")) {
  $("#tiers").addEventListener("submit", save);
  $("#agent").addEventListener("change", () => { say(""); loadTools().catch((err) => refuse(err.message)); });
  api("GET", "/api/agents").then((agents) => {
    $("#agent").replaceChildren(...agents.map((a) => el("option", { value: a.name, text: a.name })));
    return loadTools();
  }).catch((err) => refuse(err.message));
}
