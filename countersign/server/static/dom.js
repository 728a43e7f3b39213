// What the pages share (inbox, chat, tools, drafts): plain JS, no build step, loaded before each page's script.
// Every text from the server goes through textContent (`el(tag, {text})`), never innerHTML.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children) node.append(child);
  return node;
}

// A time next to now, as the CLI prints it (countersign/cli/ux.py `relative`; one format on every
// side, tests/e2e/test_chat_browser.py compares them): `in 23 h 59 min`, `4 min ago`, `in 12 s`.
function relativeTime(iso, now = Date.now()) {
  const seconds = Math.trunc((new Date(iso) - now) / 1000);
  const left = Math.abs(seconds);
  let text;
  if (left < 60) text = `${left} s`;
  else if (left < 3600) text = `${Math.floor(left / 60)} min`;
  else if (left < 86400) {
    const h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60);
    text = m ? `${h} h ${m} min` : `${h} h`;
  } else text = `${Math.floor(left / 86400)} d ${Math.floor((left % 86400) / 3600)} h`;
  return seconds >= 0 ? `in ${text}` : `${text} ago`;
}

// Lines as the server laid them out (countersign/core/shown.py), each folded one with its rest
// beside it (`folds`: [{line, rest}]): a folded line ends with its mark, " … 2,412 more characters:
// show all", which is a button here; pressing it shows the rest where the mark was. Nothing is cut
// silently: every character of every line is one press away.
function foldedLines(lines, folds, attrs) {
  const rests = new Map((folds || []).map((f) => [f.line, f.rest]));
  const pre = el("pre", attrs);
  lines.forEach((line, n) => {
    if (n) pre.append("\n");
    const rest = rests.get(n);
    const mark = rest === undefined ? -1 : line.lastIndexOf(" … ");
    if (mark < 0) { pre.append(line); return; }
    const showAll = el("button", { type: "button", class: "show-all", text: line.slice(mark + 1) });
    showAll.addEventListener("click", () => {
      showAll.replaceWith(el("span", { class: "rest", text: rest }));
    });
    pre.append(line.slice(0, mark), showAll);
  });
  return pre;
}

// What a call will do (the approval request's effect, as the server lays it out in lines with hidden
// characters made visible, long ones folded): its summary first, then each change, message and
// creation, and each message's HTML source one press away. Shared by the inbox card and the chat
// page's step; `lines` empty (a request from before effects): nothing.
function effectView(lines, folds, unresolved, effect) {
  if (!lines || !lines.length) return "";
  const [summary, ...rest] = lines;
  const sources = ((effect && effect.messages) || []).filter((m) => m.html !== null && m.html !== undefined)
    .map((m) => el("details", { class: "html-source" },
      el("summary", { text: `HTML source of the ${m.channel} to ${m.to.join(", ")}` }),
      el("pre", { text: m.html })));
  const restFolds = (folds || []).filter((f) => f.line > 0).map((f) => ({ line: f.line - 1, rest: f.rest }));
  return el("section", { class: unresolved ? "effect unresolved" : "effect", "aria-label": "What this call will do" },
    el("p", { class: "effect-summary" }, el("strong", { text: summary })),
    rest.length ? foldedLines(rest, restFolds, { class: "effect-lines" }) : "",
    ...sources);
}

async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const refusal = new Error(data.error || `HTTP ${response.status}`);
    refusal.status = response.status; // 403, 409…: a page may say which refusal it was
    throw refusal;
  }
  return data;
}

// Every page's login form (shown when signed out) and its header's "Log out".
function signInOut() {
  const form = $("#login");
  if (form) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      try {
        await api("POST", "/api/login", Object.fromEntries(new FormData(form).entries()));
        location.reload();
      } catch (err) {
        $("#login-error").textContent = err.message;
      }
    });
    $("#tenant").focus();
  }
  $("#logout")?.addEventListener("click", async () => { await api("POST", "/api/logout", {}); location.reload(); });
}

// Each cell of a table's body named by its column's heading (data-label): on a phone the pages
// show a table's rows one under the other, each cell with its heading before it (their CSS).
function labelCells(table) {
  const columns = [...table.querySelectorAll("thead th")].map((th) => th.textContent);
  for (const row of table.tBodies[0].rows) [...row.cells].forEach((cell, i) => { cell.dataset.label = columns[i]; });
}
