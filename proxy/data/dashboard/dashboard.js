"use strict";
// context-proxy's dashboard: polls /stats, /sessions and /sessions/{key} and draws what they say.
// Every string from the proxy reaches the page as text (append, textContent, setAttribute), never as HTML,
// so a session id or a model name can hold any character. Every figure shown carries the number it was
// written from (data-field, data-value), the one the proxy's JSON holds.

const POLL_MS = 2000;
const MAX_ROWS = 200; // the most recent sessions listed; the totals cover every one
const SVG_NS = "http://www.w3.org/2000/svg";

// Dollars as `context-proxy stats` writes them: 4 decimals under $10, else 2.
function usd(value) {
  const size = Math.abs(value);
  return (value < 0 ? "-" : "") + "$" + size.toFixed(size < 10 ? 4 : 2);
}
const count = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));
const share = (x) => (x === null || x === undefined ? "–" : (x * 100).toFixed(1) + "%");
const compact = (n) => (n >= 1e6 ? n / 1e6 + "M" : n >= 1e3 ? n / 1e3 + "k" : String(n));

function ago(seconds) {
  seconds = Math.max(0, seconds);
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (seconds >= size) return Math.floor(seconds / size) + unit + " ago";
  }
  return Math.floor(seconds) + "s ago";
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  node.append(...children);
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  node.append(...children);
  return node;
}

// A figure: the text shown, and the number it says as the proxy sent it.
function fig(field, value, text) {
  return el("span", { "data-field": field, "data-value": JSON.stringify(value ?? null) }, text);
}

function cell(field, value, text, cls) {
  const attrs = { "data-field": field, "data-value": JSON.stringify(value ?? null) };
  if (cls) attrs.class = cls;
  return el("td", attrs, text);
}

function card(label, value, sub, cls) {
  return el("div", { class: "card " + (cls || "") }, el("div", { class: "label" }, label),
    el("div", { class: "value" }, ...value), el("div", { class: "sub" }, ...sub));
}

class Problem extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function getJSON(path) {
  let response;
  try {
    response = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
  } catch (error) {
    throw new Problem(0, "cannot reach the proxy");
  }
  if (!response.ok) {
    let message = response.statusText;
    try {
      message = (await response.json()).error.message;
    } catch (error) { /* not the proxy's JSON error */ }
    throw new Problem(response.status, message);
  }
  return response.json();
}

function savedShare(t) {
  return t.direct_cost_usd ? share(t.saved_usd / t.direct_cost_usd) + " of direct" : "nothing billed yet";
}

// The cards of a set of totals: a `/stats` body's, or one session's row.
function figures(t) {
  const hits = t.billed_tokens ? t.billed_cached_tokens / t.billed_tokens : null;
  return [
    card("saved", [fig("saved_usd", t.saved_usd, usd(t.saved_usd))], [savedShare(t)],
      "saved" + (t.saved_usd < 0 ? " negative" : "")),
    card("billed vs direct", [fig("cost_usd", t.cost_usd, usd(t.cost_usd))],
      ["direct: ", fig("direct_cost_usd", t.direct_cost_usd, usd(t.direct_cost_usd))]),
    card("tokens", [fig("tokens_before_total", t.tokens_before_total, count(t.tokens_before_total)), " → ",
      fig("tokens_after_total", t.tokens_after_total, count(t.tokens_after_total))],
      ["sent by clients → upstream"]),
    card("cache hit rate", [fig("cache_hit_rate", "cache_hit_rate" in t ? t.cache_hit_rate : hits,
      share("cache_hit_rate" in t ? t.cache_hit_rate : hits))], ["of billed prompt tokens"]),
    card("overflows rescued", [fig("overflows_rescued", t.overflows_rescued, count(t.overflows_rescued))],
      ["turns too big to send direct"]),
    card("recall misses", [fig("recall_misses", t.recall_misses, count(t.recall_misses))],
      ["the agent needed what was removed"]),
  ];
}

function showTotals(stats) {
  const t = stats.totals;
  document.getElementById("totals").replaceChildren(el("div", { class: "cards" }, ...figures(t),
    card("sessions", [fig("sessions", t.sessions, count(t.sessions))],
      [fig("turns", t.turns, count(t.turns)), " turns"])));
}

function sessionLink(row) {
  return "#session=" + encodeURIComponent(row.key);
}

function showSessions(rows) {
  const now = Date.now() / 1000;
  const body = document.querySelector("#sessions tbody");
  body.replaceChildren(...rows.slice(0, MAX_ROWS).map((row) => {
    const tr = el("tr", { "data-key": row.key },
      el("td", { class: "id", "data-field": "id", title: row.id }, el("a", { href: sessionLink(row) }, row.id)),
      cell("api", row.api, row.api || "–"),
      cell("model", row.model, row.model || "–"),
      cell("turns", row.turns, count(row.turns), "n"),
      cell("cost_usd", row.cost_usd, usd(row.cost_usd), "n"),
      cell("direct_cost_usd", row.direct_cost_usd, usd(row.direct_cost_usd), "n"),
      cell("saved_usd", row.saved_usd, usd(row.saved_usd), "n"),
      cell("epochs", row.epochs, count(row.epochs), "n"),
      cell("last_seen", row.last_seen, ago(now - row.last_seen), "n"));
    tr.addEventListener("click", () => { location.hash = sessionLink(row); });
    return tr;
  }));
  if (rows.length > MAX_ROWS) {
    body.append(el("tr", {}, el("td", { colspan: "9" }, `… and ${rows.length - MAX_ROWS} older sessions (in the totals)`)));
  }
  document.getElementById("empty").hidden = rows.length > 0;
}

// A line chart of per-turn series, one x position per kept turn, with a dashed line where each epoch happened.
function chart(node, label, turns, series, format) {
  const W = 760, H = 250, left = 70, right = 16, top = 30, bottom = 30;
  const values = series.flatMap((s) => s.values).filter((v) => v !== null && v !== undefined);
  const ceiling = niceCeiling(values.length ? Math.max(...values) : 0);
  const n = turns.length;
  const x = (i) => left + (n <= 1 ? (W - left - right) / 2 : (i * (W - left - right)) / (n - 1));
  const y = (v) => top + (H - top - bottom) * (1 - v / ceiling);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label, "data-turns": n });
  for (let k = 0; k <= 4; k++) {
    const v = (ceiling * k) / 4;
    root.append(svg("line", { class: "grid", x1: left, x2: W - right, y1: y(v), y2: y(v) }),
      svg("text", { class: "axis", x: left - 6, y: y(v) + 4, "text-anchor": "end" }, format(v)));
  }
  const ticks = n <= 1 ? [0] : [...new Set([0, Math.floor((n - 1) / 2), n - 1])];
  for (const i of ticks.filter((i) => i < n)) {
    const anchor = n <= 1 ? "middle" : i === 0 ? "start" : i === n - 1 ? "end" : "middle";
    root.append(svg("text", { class: "axis", x: x(i), y: H - 10, "text-anchor": anchor }, "turn " + turns[i].label));
  }
  turns.forEach((t, i) => {
    if (t.epoch) {
      root.append(svg("line", { class: "epoch", x1: x(i), x2: x(i), y1: top, y2: H - bottom, "data-turn": t.label },
        svg("title", {}, `epoch at turn ${t.label}: ${t.reasons || "rewritten"}`)));
    }
  });
  for (const s of series) {
    const points = [];
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) return;
      points.push(`${x(i)},${y(v)}`);
      root.append(svg("circle", { class: "dot " + s.cls, cx: x(i), cy: y(v), r: 3, "data-series": s.name,
        "data-turn": turns[i].label, "data-value": JSON.stringify(v) },
        svg("title", {}, `turn ${turns[i].label}: ${s.label} ${format(v)}`)));
    });
    root.prepend(svg("polyline", { class: "line " + s.cls, points: points.join(" "), "data-series": s.name }));
  }
  let at = left;
  for (const s of series) {
    root.append(svg("rect", { class: "dot " + s.cls, x: at, y: 8, width: 12, height: 12 }),
      svg("text", { class: "legend", x: at + 17, y: 18 }, s.label));
    at += 30 + 7 * s.label.length;
  }
  root.append(svg("line", { class: "epoch", x1: at, x2: at, y1: 6, y2: 22 }),
    svg("text", { class: "legend legend-epoch", x: at + 6, y: 18 }, "epoch"));
  node.replaceChildren(root);
}

function niceCeiling(v) {
  if (!(v > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(v));
  return power * [1, 2, 2.5, 5, 10].find((step) => step * power >= v);
}

function showSession(detail) {
  const details = detail.turn_details || [];
  document.getElementById("session-title").replaceChildren("Session ",
    el("span", { "data-field": "id" }, detail.id), ` · ${detail.api || "–"} · ${detail.model || "–"}`);
  document.getElementById("session-figures").replaceChildren(...figures(detail),
    card("turns", [fig("turns", detail.turns, count(detail.turns))],
      [fig("epochs", detail.epochs, count(detail.epochs)), " epochs"]));
  const notes = [];
  if (detail.turns > details.length) notes.push(`The charts show the last ${details.length} of its ${detail.turns} turns.`);
  const conversations = Array.isArray(detail.conversations) ? detail.conversations.length : 1;
  if (conversations > 1) {
    notes.push(`${conversations} conversations share this id (a main thread, subagents, titles): the figures `
      + "above count them all, the charts and turns below are the main one's.");
  }
  const note = document.getElementById("session-note");
  note.textContent = notes.join(" ");
  note.hidden = notes.length === 0;

  const turns = details.map((t, i) => ({
    label: t.turn ?? "#" + (i + 1), epoch: Boolean(t.epoch), reasons: (t.reasons || []).join("+"),
  }));
  chart(document.getElementById("tokens-chart"), "tokens the client sent and tokens sent upstream, per turn", turns, [
    { name: "tokens_before", cls: "client", label: "client sent", values: details.map((t) => t.tokens_before) },
    { name: "tokens_after", cls: "upstream", label: "sent upstream", values: details.map((t) => t.tokens_after) },
  ], compact);
  chart(document.getElementById("cost-chart"), "cumulative cost, direct and through the proxy", turns, [
    { name: "cumulative_direct_cost_usd", cls: "client", label: "direct",
      values: details.map((t) => t.cumulative_direct_cost_usd) },
    { name: "cumulative_cost_usd", cls: "upstream", label: "through the proxy",
      values: details.map((t) => t.cumulative_cost_usd) },
  ], usd);

  document.querySelector("#turns tbody").replaceChildren(...details.map((t, i) => el("tr", { "data-turn": turns[i].label },
    cell("turn", t.turn, String(turns[i].label), "n"),
    cell("tokens_before", t.tokens_before, count(t.tokens_before), "n"),
    cell("tokens_after", t.tokens_after, count(t.tokens_after), "n"),
    cell("prompt_tokens", t.prompt_tokens, count(t.prompt_tokens), "n"),
    cell("cached_tokens", t.cached_tokens, count(t.cached_tokens), "n"),
    cell("epoch", t.epoch ?? false, t.unedited ? "sent as is (" + t.unedited + ")" : t.epoch ? turns[i].reasons || "yes" : ""),
    cell("cost_usd", t.cost_usd, t.cost_usd === null || t.cost_usd === undefined ? "–" : usd(t.cost_usd), "n"),
    cell("direct_cost_usd", t.direct_cost_usd,
      t.direct_cost_usd === null || t.direct_cost_usd === undefined ? "–" : usd(t.direct_cost_usd), "n"),
    cell("cumulative_cost_usd", t.cumulative_cost_usd, usd(t.cumulative_cost_usd), "n"),
    cell("cumulative_direct_cost_usd", t.cumulative_direct_cost_usd, usd(t.cumulative_direct_cost_usd), "n"),
  )).reverse());
}

function selectedKey() {
  const match = location.hash.match(/^#session=(.+)$/);
  try {
    return match ? decodeURIComponent(match[1]) : null;
  } catch (error) {
    return null; // a hand-edited address that is no encoded id
  }
}

function setProblem(text) {
  const node = document.getElementById("problem");
  node.textContent = text || "";
  node.hidden = !text;
}

const TOKEN_NEEDED = "The proxy wants its admin token: open /dashboard?token=YOUR_TOKEN once (it is kept as a cookie).";
let timer = null;
let generation = 0;
let refreshes = 0;

async function refresh() {
  clearTimeout(timer);
  const mine = ++generation;
  const key = selectedKey();
  try {
    if (document.hidden) return; // nobody is watching: poll again when the tab is shown
    const detail = key === null ? null : getJSON("/sessions/" + encodeURIComponent(key)).catch((error) => error);
    const [stats, rows] = await Promise.all([getJSON("/stats"), getJSON("/sessions")]);
    const session = await detail;
    if (mine !== generation) return; // the view changed meanwhile: a newer refresh draws it
    showTotals(stats);
    showSessions(rows);
    document.getElementById("list").hidden = key !== null;
    document.getElementById("totals").hidden = key !== null; // drawn all the same: the view may change back
    document.getElementById("session").hidden = key === null;
    if (session instanceof Problem) {
      setProblem(session.status === 404 ? "This session is not kept any more (or never was)." : session.message);
    } else {
      if (session !== null) showSession(session);
      setProblem(null);
    }
    const time = new Date().toLocaleTimeString("en-GB");
    document.getElementById("status").textContent =
      `context-proxy ${stats.version} · updated ${time}, every ${POLL_MS / 1000} s`;
    document.body.dataset.refreshes = String(++refreshes);
  } catch (error) {
    if (mine !== generation) return;
    if (error.status === 401) setProblem(TOKEN_NEEDED);
    else if (error.status === 0) setProblem("Cannot reach the proxy; trying again.");
    else setProblem(`The proxy answered ${error.status}: ${error.message}`);
  } finally {
    if (mine === generation) timer = setTimeout(refresh, POLL_MS);
  }
}

window.addEventListener("hashchange", refresh);
document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
refresh();
