// dumpdb serve: the pages. Every value from the archive is put in the DOM with textContent
// (never innerHTML), so names holding HTML or script render as text.
"use strict";

const $main = document.getElementById("main");
const Q = new URLSearchParams(location.search);

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") e.textContent = String(v);
    else if (k === "cls") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
  return e;
}
function url(path, params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== undefined && v !== "") u.set(k, v);
  const s = u.toString();
  return s ? `${path}?${s}` : path;
}
async function api(path, params) {
  const r = await fetch(url(path, params));
  const data = await r.json();
  if (!r.ok) throw new Error(data.error || `HTTP ${r.status}`);
  return data;
}
function fail(where, err) { where.append(el("p", {cls: "error", text: String(err.message || err)})); }
function fmt(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : (Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : v.toPrecision(5));
  if (Array.isArray(v)) return "[" + v.map(fmt).join(", ") + "]";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}
function table(columns, rows, cell) {
  const t = el("table", {cls: "grid"});
  t.append(el("tr", {}, ...columns.map(c => el("th", {text: c}))));
  for (const r of rows) {
    const tr = el("tr");
    columns.forEach((c, i) => {
      const v = Array.isArray(r) ? r[i] : r[c];
      const custom = cell ? cell(c, v, r) : null;
      const td = el("td", {cls: typeof v === "number" ? "num" : null, title: typeof v === "string" && v.length > 40 ? v : null});
      if (custom instanceof Node) td.append(custom); else td.textContent = fmt(v);
      tr.append(td);
    });
    t.append(tr);
  }
  return t;
}
function kv(obj, keys) {
  const t = el("table", {cls: "grid kv"});
  for (const k of keys || Object.keys(obj)) if (obj[k] !== null && obj[k] !== undefined) t.append(el("tr", {}, el("td", {text: k}), el("td", {text: fmt(obj[k])})));
  return t;
}
function setWhere(text) { document.getElementById("where").textContent = text; document.title = `dumpdb: ${text}`; }
const VERDICT = ["pass", "warning", "error"];
function verdictClass(sev) { return sev === null || sev === undefined ? "v-none" : "v-" + VERDICT[sev]; }

// ---------------------------------------------------------------- virtual tree
// Only the rows in view are in the DOM (a node per 22 px); children come from load(node, offset).
class VTree {
  constructor(container, load, decorate, onpick) {
    this.box = el("div", {cls: "tree"});
    this.spacer = el("div", {cls: "spacer"});
    this.box.append(this.spacer);
    container.append(this.box);
    this.load = load; this.decorate = decorate; this.onpick = onpick;
    this.root = {path: "", depth: -1, expanded: true, children: null};
    this.rows = []; this.H = 22; this.selected = null; this.firsts = new Set();
    this.box.addEventListener("scroll", () => this.draw());
  }
  async init() { await this.fetch(this.root); this.flatten(); }
  async fetch(node, offset) {
    const data = await this.load(node.path, offset || 0);
    const kids = data.children.map(c => ({...c, depth: node.depth + 1, expanded: false, children: null, parent: node}));
    node.children = (offset ? node.children.filter(c => !c.more) : []).concat(kids);
    if (data.more) node.children.push({more: true, depth: node.depth + 1, parent: node, path: node.path + "\u0000more", name: "… more", offset: (offset || 0) + kids.length});
  }
  flatten() {
    const out = [];
    const walk = n => { for (const c of n.children || []) { out.push(c); if (c.expanded) walk(c); } };
    walk(this.root);
    this.rows = out;
    this.spacer.style.height = `${out.length * this.H}px`;
    this.draw();
  }
  draw() {
    const top = this.box.scrollTop, h = this.box.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / this.H) - 5), last = Math.min(this.rows.length, Math.ceil((top + h) / this.H) + 5);
    this.spacer.replaceChildren();
    for (let i = first; i < last; i++) {
      const n = this.rows[i];
      const row = el("div", {cls: "node", style: `top:${i * this.H}px;padding-left:${n.depth * 16 + 4}px`, "data-path": n.path});
      if (n.more) { row.append(el("span", {cls: "muted", text: n.name})); row.addEventListener("click", () => this.more(n)); }
      else {
        row.append(el("span", {cls: "tw", text: n.has_children ? (n.expanded ? "▾" : "▸") : "·"}));
        this.decorate(row, n);
        if (this.selected === n.path) row.classList.add("sel");
        if (this.firsts.has(n.path)) row.classList.add("first");
        row.addEventListener("click", () => this.click(n));
      }
      this.spacer.append(row);
    }
  }
  async more(n) { await this.fetch(n.parent, n.offset); this.flatten(); }
  async toggle(n) {
    if (!n.has_children) return;
    if (!n.expanded && n.children === null) await this.fetch(n);
    n.expanded = !n.expanded; this.flatten();
  }
  async click(n) { this.selected = n.path; await this.toggle(n); this.draw(); if (this.onpick) this.onpick(n); }
  // Expand every ancestor of `path` (fetching children as needed), select it, scroll to it.
  async reveal(path, mark) {
    let node = this.root;
    const parts = path.split("/");
    for (let i = 0; i < parts.length; i++) {
      const want = parts.slice(0, i + 1).join("/");
      if (node.children === null) await this.fetch(node);
      let next = (node.children || []).find(c => c.path === want);
      while (!next && node.children.length && node.children[node.children.length - 1].more) {
        await this.fetch(node, node.children[node.children.length - 1].offset);
        next = node.children.find(c => c.path === want);
      }
      if (!next) break;
      if (i < parts.length - 1 && next.has_children && !next.expanded) { if (next.children === null) await this.fetch(next); next.expanded = true; }
      node = next;
    }
    if (mark) this.firsts.add(node.path);
    this.selected = node.path;
    this.flatten();
    const at = this.rows.indexOf(node);
    if (at >= 0) this.box.scrollTop = Math.max(0, at * this.H - this.box.clientHeight / 3);
    this.draw();
    return node;
  }
}

// ---------------------------------------------------------------- pictures
function heatColor(t) { // t in [0,1] -> a blue-white-red ramp
  const c = t < 0.5 ? [59 + (255 - 59) * t * 2, 76 + (255 - 76) * t * 2, 192 + (255 - 192) * t * 2]
    : [255 - (255 - 180) * (t - 0.5) * 2, 255 - (255 - 4) * (t - 0.5) * 2, 255 - (255 - 38) * (t - 0.5) * 2];
  return c.map(Math.round);
}
function drawHeatmap(box, hm, title) {
  const bin = atob(hm.data); const buf = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) buf[i] = bin.charCodeAt(i);
  const v = new Float32Array(buf.buffer);
  const cv = el("canvas", {cls: "heat", width: hm.cols, height: hm.rows, "data-rows": hm.rows, "data-cols": hm.cols});
  const scale = Math.max(1, Math.floor(512 / Math.max(hm.cols, hm.rows)));
  cv.style.width = `${Math.min(hm.cols * scale, 1024)}px`;
  cv.style.height = `${Math.max(hm.rows * scale, 24)}px`;
  const ctx = cv.getContext("2d"); const img = ctx.createImageData(hm.cols, hm.rows);
  const lo = hm.min ?? 0, hi = hm.max ?? 1, span = hi - lo || 1;
  for (let i = 0; i < v.length; i++) {
    let rgb;
    if (Number.isNaN(v[i])) rgb = [255, 0, 255];
    else if (v[i] === Infinity) rgb = [0, 0, 0];
    else if (v[i] === -Infinity) rgb = [0, 160, 0];
    else rgb = heatColor((v[i] - lo) / span);
    img.data.set([...rgb, 255], i * 4);
  }
  ctx.putImageData(img, 0, 0);
  box.append(el("h2", {text: title}),
    el("p", {cls: "muted", text: `${hm.source_rows} x ${hm.source_cols} shown as ${hm.rows} x ${hm.cols} cells (${hm.reduce} of each block); colour from ${fmt(hm.min)} (blue) to ${fmt(hm.max)} (red); NaN magenta, +Inf black, -Inf green`}),
    cv);
}
function svg(tag, attrs) { const e = document.createElementNS("http://www.w3.org/2000/svg", tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); return e; }
function drawHistogram(box, h, title) {
  const W = 520, H = 160, s = svg("svg", {width: W, height: H + 20, class: "hist"});
  const max = Math.max(1, ...h.counts);
  const bw = W / Math.max(1, h.counts.length);
  h.counts.forEach((c, i) => {
    const bh = c ? Math.max(1, Math.log1p(c) / Math.log1p(max) * H) : 0;
    const r = svg("rect", {x: i * bw, y: H - bh, width: Math.max(1, bw - 1), height: bh, fill: "#4a78c9"});
    const t = svg("title", {}); t.textContent = `[${fmt(h.edges[i])}, ${fmt(h.edges[i + 1])}): ${c}`; r.append(t);
    s.append(r);
  });
  const lab = (x, text, anchor) => { const t = svg("text", {x, y: H + 14, "font-size": 11, "text-anchor": anchor}); t.textContent = text; s.append(t); };
  if (h.edges.length) { lab(0, fmt(h.edges[0]), "start"); lab(W, fmt(h.edges[h.edges.length - 1]), "end"); }
  box.append(el("h2", {text: title}), s,
    el("p", {cls: "muted", text: `${h.values} values (log-scaled counts); NaN ${h.nan}, +Inf ${h.pos_inf}, -Inf ${h.neg_inf}`}));
}

// ---------------------------------------------------------------- pages
async function pageRuns() {
  setWhere("runs");
  const data = await api("/api/runs");
  $main.replaceChildren(el("h1", {text: "Runs"}));
  const cols = ["run", "state", "layout", "framework", "ranks", "iterations", "ops", "tensors", "stored", "statistics_only", "pruned", "bytes_in", "ingest_started", "ingest_finished"];
  $main.append(table(cols, data.runs, (c, v, r) => c === "run" ? el("span", {},
    el("a", {href: url("/tree", {run: v}), text: v, cls: "run-link"}), " ",
    el("a", {href: url("/ranks", {run: v}), cls: "muted", text: "ranks"})) : null));
  const names = data.runs.map(r => r.run);
  const pick = (id, i) => el("select", {id}, ...names.map((n, j) => { const o = el("option", {value: n, text: n}); if (j === i) o.selected = true; return o; }));
  const t = pick("cmp-target", 0), b = pick("cmp-bench", Math.min(1, names.length - 1));
  $main.append(el("h2", {text: "Compare two runs"}),
    el("div", {cls: "filters"}, "target", t, "bench", b,
      el("button", {id: "cmp-go", text: "Compare", onclick: () => { location.href = url("/compare", {target: t.value, bench: b.value}); }})));
  if (data.compares.length) {
    $main.append(el("h2", {text: "Stored compares"}));
    $main.append(table(["compare_id", "target_selection", "bench_selection", "mode", "pairs", "unmatched_target", "unmatched_bench", "created_at"], data.compares,
      (c, v) => c === "compare_id" ? el("a", {href: url("/compare", {id: v}), text: String(v)}) : null));
  }
}

function treeDecorate(row, n) {
  row.append(el("span", {cls: "name", text: n.name}));
  if (n.op_type) row.append(el("span", {cls: "meta", text: n.op_type}));
  row.append(el("span", {cls: "meta", text: `${n.ops} op${n.ops === 1 ? "" : "s"}, ${n.tensors} tensors` + (n.min !== null && n.min !== undefined ? `, [${fmt(n.min)}, ${fmt(n.max)}]` : "")}));
  if (n.nan_tensors) row.append(el("span", {cls: "badge nan", text: `NaN ${n.nan_tensors}`}));
  if (n.inf_tensors) row.append(el("span", {cls: "badge inf", text: `Inf ${n.inf_tensors}`}));
  if (n.overflow_tensors) row.append(el("span", {cls: "badge ovf", text: `overflow ${n.overflow_tensors}`}));
}

async function pageTree() {
  const run = Q.get("run");
  setWhere(`tree of ${run}`);
  $main.replaceChildren(el("h1", {text: `Model tree: ${run}`}));
  const input = el("input", {type: "search", id: "search", placeholder: "search ops (name contains…)", size: 50});
  const results = el("div", {cls: "results", id: "search-results"});
  const side = el("div", {cls: "panel", id: "op-panel", style: "flex:1;min-width:300px"}, el("p", {cls: "muted", text: "Click an op to see its tensors."}));
  const left = el("div", {style: "flex:2;min-width:400px"});
  $main.append(el("div", {cls: "filters"}, input, el("a", {href: url("/api/tree", {run}), text: "JSON"}), el("a", {href: url("/ranks", {run}), text: "ranks"})), results, el("div", {cls: "row"}, left, side));
  const tree = new VTree(left, (path, offset) => api("/api/tree", {run, path, offset}), treeDecorate,
    n => { if (n.op) { history.replaceState(null, "", url("/tree", {run, op: n.op, path: n.path})); showOp(side, run, n.op); } });
  await tree.init();
  let timer = null;
  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      const q = input.value.trim();
      results.replaceChildren();
      if (!q) return;
      const data = await api("/api/search", {run, q});
      for (const m of data.matches) results.append(el("div", {text: m.path, title: m.path, onclick: async () => { await tree.reveal(m.path); showOp(side, run, m.op); }}));
      if (!data.matches.length) results.append(el("span", {cls: "muted", text: "no op matches"}));
    }, 200);
  });
  if (Q.get("path")) { await tree.reveal(Q.get("path")); if (Q.get("op")) showOp(side, run, Q.get("op")); }
}

async function showOp(box, run, op) {
  box.replaceChildren(el("p", {cls: "muted", text: "loading…"}));
  try {
    const data = await api("/api/op", {run, op});
    box.replaceChildren(el("h2", {text: op}), el("p", {}, el("a", {href: url("/op", {run, op}), text: "op page"}), " · ", el("a", {href: url("/api/op", {run, op}), text: "JSON"})));
    if (data.source && data.source.code_file) box.append(el("pre", {cls: "code", text: `${data.source.code_file}:${data.source.code_line}\n${data.source.code_text || ""}`}));
    box.append(table(["tensor_id", "iteration", "rank", "io", "slot", "dtype", "shape", "min", "max", "mean", "nan_count"], data.tensors,
      (c, v) => c === "tensor_id" ? el("a", {href: url("/tensor", {id: v}), text: String(v), cls: "tensor-link"}) : null));
  } catch (e) { box.replaceChildren(); fail(box, e); }
}

async function pageOp() {
  const run = Q.get("run"), op = Q.get("op");
  setWhere(`op ${op}`);
  const data = await api("/api/op", {run, op});
  $main.replaceChildren(el("h1", {text: op}), el("p", {}, "run ", el("a", {href: url("/tree", {run}), text: run})));
  if (data.source) {
    $main.append(el("h2", {text: "Source"}), kv(data.source, ["op_type", "ir_op_type", "code_file", "code_line", "code_text", "input_shapes", "input_dtypes", "output_shapes", "output_dtypes"]));
    if (data.source.code_trace && data.source.code_trace.length) $main.append(el("pre", {cls: "code", text: data.source.code_trace.join("\n")}));
  }
  for (const s of data.stacks) $main.append(el("h2", {text: `call stack (rank ${fmt(s.rank)}, iteration ${fmt(s.iteration)})`}), el("pre", {cls: "code", text: fmt(s.frames)}));
  $main.append(el("h2", {text: "Tensors"}), table(["tensor_id", "iteration", "rank", "io", "slot", "arg_name", "dtype", "shape", "nbytes", "min", "max", "mean", "l2norm", "nan_count", "pos_inf_count", "neg_inf_count", "stored"], data.tensors,
    (c, v) => c === "tensor_id" ? el("a", {href: url("/tensor", {id: v}), text: String(v)}) : null));
}

async function pageTensor() {
  const id = Q.get("id");
  setWhere(`tensor ${id}`);
  const info = await api("/api/tensor", {id});
  $main.replaceChildren(el("h1", {text: `Tensor ${id}: ${info.op_name} ${info.io} ${fmt(info.slot)}`}),
    el("p", {}, el("a", {href: url("/op", {run: info.run, op: info.scope_name || info.op_name}), text: "op"}), " · ",
      el("a", {href: url("/tree", {run: info.run}), text: `tree of ${info.run}`}), " · ",
      el("a", {href: url("/api/tensor.npy", {id}), id: "npy", text: "download .npy"}), " · ",
      el("a", {href: url("/api/tensor", {id}), text: "JSON"})));
  const row = el("div", {cls: "row"});
  const meta = el("div", {cls: "panel"}, kv(info));
  const pics = el("div", {cls: "panel", id: "pictures"});
  row.append(meta, pics); $main.append(row);
  if (!info.stored) { pics.append(el("p", {cls: "muted", text: "no payload stored (statistics only or pruned): no heatmap"})); return; }
  try { drawHeatmap(pics, await api("/api/tensor/heatmap", {id}), "Heatmap"); drawHistogram(pics, await api("/api/tensor/histogram", {id}), "Histogram"); }
  catch (e) { fail(pics, e); }
}

async function pagePair() {
  const target = Q.get("target"), bench = Q.get("bench");
  setWhere(`pair ${target} / ${bench}`);
  const data = await api("/api/pair", {target, bench});
  $main.replaceChildren(el("h1", {text: `Pair: ${data.target.op_name} ${data.target.io} ${fmt(data.target.slot)}`}),
    el("p", {}, el("a", {href: url("/tensor", {id: target}), text: `target tensor ${target}`}), " · ", el("a", {href: url("/tensor", {id: bench}), text: `bench tensor ${bench}`})));
  const cols = ["run", "op_name", "dtype", "shape", "min", "max", "mean", "l2norm", "nan_count"];
  $main.append(table(["side", ...cols], [["target", ...cols.map(c => data.target[c])], ["bench", ...cols.map(c => data.bench[c])]]));
  const pics = el("div", {cls: "panel", id: "pictures"}); $main.append(pics);
  try { drawHeatmap(pics, await api("/api/pair/heatmap", {target, bench}), "Difference heatmap |target - bench|"); drawHistogram(pics, await api("/api/pair/histogram", {target, bench}), "Difference histogram (target - bench)"); }
  catch (e) { fail(pics, e); }
}

async function pageCompare() {
  const key = Q.get("id") ? {id: Q.get("id")} : {target: Q.get("target"), bench: Q.get("bench"), iteration: Q.get("iteration"), selection_rank: Q.get("selection_rank")};
  setWhere("compare");
  $main.replaceChildren(el("p", {cls: "muted", text: "comparing…"}));
  const s = await api("/api/compare", key);
  const filters = {verdict: Q.get("verdict"), op_type: Q.get("op_type"), phase: Q.get("phase"), rank: Q.get("rank")};
  const sum = s.summary;
  $main.replaceChildren(el("h1", {text: `Compare ${sum.target} vs ${sum.bench}`}),
    el("p", {cls: "muted", text: `${sum.pairs} pairs · pass ${sum.pass} · warning ${sum.warning} · error ${sum.error} · target only ${sum.unmatched_target} · bench only ${sum.unmatched_bench} · verdicts: ${s.rules} rules · `},
      el("a", {href: url("/api/compare", key), text: "JSON"})));
  const bar = el("div", {cls: "filters"});
  for (const [name, values] of Object.entries(s.options)) {
    const sel = el("select", {id: `filter-${name}`}, el("option", {value: "", text: `any ${name}`}), ...values.map(v => { const o = el("option", {value: v, text: String(v)}); if (String(filters[name]) === String(v)) o.selected = true; return o; }));
    sel.addEventListener("change", () => { const p = new URLSearchParams(location.search); if (sel.value) p.set(name, sel.value); else p.delete(name); location.search = p.toString(); });
    bar.append(sel);
  }
  bar.append(el("span", {cls: "legend"}, ...["pass", "warning", "error"].map(v => el("span", {}, el("span", {cls: `dot v-${v}`}), v)), el("span", {}, el("span", {cls: "badge ins", text: "+"}), " target only"), el("span", {}, el("span", {cls: "badge rem", text: "−"}), " bench only")));
  $main.append(bar);
  const firsts = el("div", {cls: "panel firsts", id: "firsts"}, el("h2", {text: "First departure"}));
  if (!s.firsts.length) firsts.append(el("p", {cls: "muted", text: "no departure"}));
  $main.append(firsts);
  const plotBox = el("div", {cls: "panel", id: "plot"}); $main.append(plotBox);
  const grid = el("div", {cls: "cols2"});
  const tBox = el("div", {}, el("h2", {text: `target: ${sum.target}`})), bBox = el("div", {}, el("h2", {text: `bench: ${sum.bench}`}));
  grid.append(tBox, bBox); $main.append(grid);
  const detail = el("div", {cls: "panel", id: "pair-panel"}); $main.append(detail);
  const decorate = (row, n) => {
    row.append(el("span", {cls: `dot ${verdictClass(n.worst)}`}), el("span", {cls: "name", text: n.name}));
    if (n.op_type) row.append(el("span", {cls: "meta", text: n.op_type}));
    row.append(el("span", {cls: "meta", text: `${n.pairs} pairs` + (n.max_err !== null && n.max_err !== undefined ? `, err ≤ ${fmt(n.max_err)}` : "")}));
    if (n.inserted) row.append(el("span", {cls: "badge ins", text: `+${n.inserted}`}));
    if (n.removed) row.append(el("span", {cls: "badge rem", text: `−${n.removed}`}));
    if (n.firsts && n.firsts.length) row.append(el("span", {cls: "badge first", text: "first departure"}));
  };
  let trees = {};
  const pick = side => async n => {
    const other = side === "target" ? trees.bench : trees.target;
    if (n.link) await other.reveal(n.link);
    if (n.op) showPairs(detail, key, side, n.op);
  };
  trees.target = new VTree(tBox, (path, offset) => api("/api/compare/tree", {...key, ...filters, side: "target", path, offset}), decorate, pick("target"));
  trees.bench = new VTree(bBox, (path, offset) => api("/api/compare/tree", {...key, ...filters, side: "bench", path, offset}), decorate, pick("bench"));
  await Promise.all([trees.target.init(), trees.bench.init()]);
  const plot = await api("/api/compare/plot", {...key, ...filters});
  drawPlot(plotBox, plot);
  for (const f of s.firsts) {
    const item = el("div", {cls: "first-item", text: `${f.label}: #${f.pair_index} ${f.target_name} ${f.io} ${fmt(f.slot)} (rank ${fmt(f.rank)}, iteration ${fmt(f.iteration)}) — ${f.result}`});
    item.addEventListener("click", () => revealFirst(f));
    firsts.append(item);
  }
  async function revealFirst(f) {
    if (!f.t_path) return;
    const n = await trees.target.reveal(f.t_path, true);
    if (f.b_path) await trees.bench.reveal(f.b_path, true);
    if (n && n.op) showPairs(detail, key, "target", n.op, f.pair_index);
  }
  if (s.firsts.length) await revealFirst(s.firsts[0]);
}

async function showPairs(box, key, side, op, highlight) {
  box.replaceChildren(el("p", {cls: "muted", text: "loading…"}));
  try {
    const data = await api("/api/compare/pairs", {...key, side, op});
    box.replaceChildren(el("h2", {text: op}));
    box.append(table(["pair_index", "kind", "io", "slot", "iteration", "rank", "verdict", "err", "floor", "t_id", "b_id", "diff"], data.pairs.map(p => ({...p, diff: p.t_id !== null && p.b_id !== null ? "heatmap" : null})),
      (c, v, r) => {
        if (c === "diff" && v) return el("a", {href: url("/pair", {target: r.t_id, bench: r.b_id}), text: "difference", cls: r.pair_index === highlight ? "diff-link first-diff" : "diff-link"});
        if ((c === "t_id" || c === "b_id") && v !== null) return el("a", {href: url("/tensor", {id: v}), text: String(v)});
        if (c === "verdict" && v) return el("span", {}, el("span", {cls: `dot v-${v}`}), v);
        return null;
      }));
  } catch (e) { box.replaceChildren(); fail(box, e); }
}

function drawPlot(box, plot) {
  const pts = plot.points.filter(p => p.err !== null && typeof p.err === "number");
  box.append(el("h2", {text: `Error along execution order (${plot.metric}, log scale) with the precision floor`}));
  if (!pts.length) { box.append(el("p", {cls: "muted", text: "no error values"})); return; }
  const W = 900, H = 200, L = 50;
  const s = svg("svg", {width: W + L, height: H + 30, id: "error-plot"});
  const pos = v => v > 0 && Number.isFinite(v);
  const vals = pts.flatMap(p => [p.err, p.floor]).filter(pos);
  const lo = Math.log10(Math.min(...vals, 1e-12)), hi = Math.log10(Math.max(...vals, 1e-11));
  const xmax = Math.max(1, ...pts.map(p => p.x));
  const X = x => L + x / xmax * W, Y = v => H - (Math.log10(v) - lo) / (hi - lo || 1) * H;
  let floor = "";
  for (const p of pts) if (pos(p.floor)) floor += `${floor ? "L" : "M"}${X(p.x).toFixed(1)},${Y(p.floor).toFixed(1)}`;
  if (floor) s.append(svg("path", {d: floor, stroke: "#888", fill: "none", "stroke-dasharray": "4 3", class: "floor"}));
  for (const p of pts) {
    const y = pos(p.err) ? Y(p.err) : H;
    const c = svg("circle", {cx: X(p.x), cy: y, r: 2.5, fill: ["#2e9d57", "#d99a18", "#d6453d"][p.sev] || "#8d94a3"});
    const t = svg("title", {}); t.textContent = `pair ${p.x}: ${plot.metric} ${fmt(p.err)}, floor ${fmt(p.floor)}`; c.append(t);
    s.append(c);
  }
  const lab = (x, y, text, anchor) => { const t = svg("text", {x, y, "font-size": 11, "text-anchor": anchor || "start"}); t.textContent = text; s.append(t); };
  lab(L - 4, 10, `1e${Math.round(hi)}`, "end"); lab(L - 4, H, `1e${Math.round(lo)}`, "end");
  lab(L, H + 20, "0"); lab(L + W, H + 20, `pair ${xmax}`, "end");
  lab(L + W / 2, H + 20, "dashed: precision floor", "middle");
  box.append(s);
}

async function pageRanks() {
  const run = Q.get("run");
  setWhere(`ranks of ${run}`);
  const data = await api("/api/ranks", {run, iteration: Q.get("iteration")});
  $main.replaceChildren(el("h1", {text: `Ranks: ${run}`}),
    el("p", {cls: "muted", text: `${data.ranks.length} ranks x ${data.ops.length} ops${data.ops_total > data.ops.length ? ` (of ${data.ops_total})` : ""}; green: agrees with the rank majority, red: departs, grey: op missing on that rank`}));
  const cell = Math.max(3, Math.min(14, Math.floor(1100 / Math.max(1, data.ops.length))));
  const cv = el("canvas", {id: "rank-grid", width: data.ops.length * cell, height: data.ranks.length * 16});
  const ctx = cv.getContext("2d");
  const colour = {agree: "#2e9d57", departs: "#d6453d", missing: "#c9ced8"};
  data.cells.forEach((row, r) => row.forEach((st, o) => { ctx.fillStyle = colour[st]; ctx.fillRect(o * cell, r * 16, cell - 1, 15); }));
  const info = el("p", {id: "rank-cell", cls: "muted", text: "hover a cell"});
  cv.addEventListener("mousemove", e => {
    const o = Math.floor(e.offsetX / cell), r = Math.floor(e.offsetY / 16);
    if (data.ops[o] && data.ranks[r] !== undefined) info.textContent = `rank ${fmt(data.ranks[r])}, ${data.ops[o].op_name} (iteration ${fmt(data.ops[o].iteration)}): ${data.cells[r][o]}`;
  });
  const labels = el("div", {style: "display:flex;flex-direction:column;font-size:12px"}, ...data.ranks.map(r => el("div", {style: "height:16px;line-height:16px", text: `rank ${fmt(r)}`})));
  $main.append(el("div", {cls: "row", style: "overflow:auto"}, labels, cv), info);
  $main.append(el("h2", {text: "Rank groups"}), table(["rank", "group", "reference", "tensors", "departs_at", "first_diff_iteration", "first_diff_position", "first_diff_op", "first_diff_io", "first_diff_slot"], data.groups));
}

async function pageSql() {
  setWhere("SQL");
  const q = Q.get("q") || "SELECT run, count(*) AS tensors FROM tensors GROUP BY run ORDER BY run";
  const page = Number(Q.get("page") || 0);
  const box = el("textarea", {id: "sql", rows: 6}); box.value = q;
  const out = el("div", {id: "sql-out"});
  const run = () => { location.href = url("/sql", {q: box.value}); };
  $main.replaceChildren(el("h1", {text: "SQL (read-only, sandboxed as dumpdb sql)"}), box,
    el("div", {cls: "filters"}, el("button", {id: "sql-run", text: "Run", onclick: run}),
      el("a", {id: "dl-csv", href: url("/api/sql.csv", {q}), download: "query.csv", text: "CSV"}),
      el("a", {id: "dl-json", href: url("/api/sql.json", {q}), download: "query.json", text: "JSON"}),
      el("a", {id: "dl-parquet", href: url("/api/sql.parquet", {q}), download: "query.parquet", text: "Parquet"})), out);
  box.addEventListener("keydown", e => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) run(); });
  try {
    const data = await api("/api/sql", {q, page});
    out.append(table(data.columns, data.rows));
    out.append(el("div", {cls: "filters"},
      page > 0 ? el("a", {href: url("/sql", {q, page: page - 1}), text: "‹ previous"}) : null,
      el("span", {cls: "muted", text: `page ${page + 1}, rows ${page * data.page_size + 1}–${page * data.page_size + data.rows.length}`}),
      data.more ? el("a", {id: "next-page", href: url("/sql", {q, page: page + 1}), text: "next ›"}) : null));
  } catch (e) { fail(out, e); }
}

const PAGES = {"/": pageRuns, "/tree": pageTree, "/op": pageOp, "/tensor": pageTensor, "/pair": pagePair, "/compare": pageCompare, "/ranks": pageRanks, "/sql": pageSql};
(PAGES[location.pathname] || pageRuns)().then(() => document.body.setAttribute("data-ready", "1"))
  .catch(e => { $main.replaceChildren(); fail($main, e); document.body.setAttribute("data-ready", "1"); });
