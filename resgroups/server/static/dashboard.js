// The live page of `resgroups serve`: reads /api/state every second and
// updates the charts (uPlot) and the tables in place. Plain JavaScript, no
// build step; every request goes to the server that served the page.
//
// One vocabulary for CPU, as resource_groups() and `resgroups demo` speak it: a
// percentage of the CPUs the server's process may use (state.cpus), idle shown,
// a group's cpu_limit_pct drawn as a dashed line on its band.
"use strict";

const REFRESH_MS = 1000;
// the first ten: Tableau 10, as the demo's chart; then Tableau 20's companions;
// past them, hues a golden angle apart, so that 13 or 100 groups keep distinct colours
const PALETTE = [
  "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
  "#1f3f66", "#b6992d", "#8cd17d", "#7b2f3b", "#499894",
  "#d37295", "#79706e", "#a0cbe8", "#ffbe7d", "#d7b5a6",
];
const IDLE = "#d9d9d9";
const WINDOWS = [30, 60, 120, 300]; // seconds the charts show, the user's choice

// What the page knows, for the curious (and for the tests): the last state,
// the charts, how many updates it has drawn, each group's colour.
const dashboard = {
  state: null,
  charts: {},
  chartsKey: "",
  updates: 0,
  failures: 0,
  colours: {},
  windowSeconds: 300,
  tree: null,
  cpuSeries: null,
};
window.dashboard = dashboard;

const $ = (selector) => document.querySelector(selector);

function paletteColour(i) {
  if (i < PALETTE.length) return PALETTE[i];
  const hue = Math.round((15 + i * 137.508) % 360);
  const light = [42, 56, 34][i % 3];
  return `hsl(${hue} 62% ${light}%)`;
}

// A group keeps the colour it was first given (creation order) for as long as
// the page is open, whatever groups come and go.
function colourOf(name) {
  if (!(name in dashboard.colours)) {
    dashboard.colours[name] = paletteColour(Object.keys(dashboard.colours).length);
  }
  return dashboard.colours[name];
}

// A translucent fill of a colour given as #rrggbb or hsl(...).
function fillOf(colour) {
  return colour.startsWith("#") ? `${colour}b3` : colour.replace(")", " / 0.7)");
}

function formatBytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

function formatMillis(ms) {
  if (ms === null || ms === undefined) return "";
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}

function formatPct(pct) {
  return pct === null || pct === undefined ? "" : `${pct.toFixed(1)} %`;
}

// ---- the tree of groups -----------------------------------------------------

// The groups in tree order: each top-level group (parent_group null or absent)
// followed by its children, depth first, in creation order within a level.
// `depth` is 0 at the top. Without a parent_group column every group is at the top.
function groupTree(groups) {
  const byName = new Map(groups.map((g) => [g.name, g]));
  const children = new Map();
  const roots = [];
  for (const g of groups) {
    const parent = g.parent_group ?? null;
    if (parent === null || !byName.has(parent) || parent === g.name) {
      roots.push(g);
    } else {
      if (!children.has(parent)) children.set(parent, []);
      children.get(parent).push(g);
    }
  }
  const out = [];
  const seen = new Set();
  const visit = (g, depth) => {
    if (seen.has(g.name)) return; // a cycle cannot be drawn twice
    seen.add(g.name);
    const kids = children.get(g.name) || [];
    out.push({ group: g, name: g.name, depth, children: kids.map((k) => k.name) });
    for (const kid of kids) visit(kid, depth + 1);
  };
  for (const root of roots) visit(root, 0);
  for (const g of groups) visit(g, 0); // whatever a cycle left out
  return out;
}
dashboard.groupTree = groupTree;

// ---- series over the chosen window ---------------------------------------------

function windowed(history) {
  const since = history.t.length ? history.t[history.t.length - 1] - dashboard.windowSeconds : 0;
  let first = history.t.findIndex((t) => t >= since);
  if (first < 0) first = history.t.length;
  const groups = {};
  for (const [name, series] of Object.entries(history.groups)) {
    groups[name] = Object.fromEntries(
      Object.entries(series).map(([field, values]) => [field, values.slice(Math.max(0, first - 1))]),
    );
  }
  return { t: history.t.slice(Math.max(0, first - 1)), groups, dropFirst: first > 0 };
}

// Each group's CPU used between consecutive samples, % of the CPUs: the change of
// cpu_nanos_total over the seconds between them.
function cpuUsed(history, names, cpus) {
  const t = history.t;
  const out = {};
  for (const name of names) {
    const total = history.groups[name].cpu_nanos_total || [];
    out[name] = t.map((at, i) => {
      if (i === 0 || total[i] === null || total[i - 1] === null || total[i] === undefined) return 0;
      const seconds = at - t[i - 1];
      const used = total[i] - total[i - 1];
      return seconds > 0 && used > 0 ? (100 * used) / (seconds * 1e9 * cpus) : 0;
    });
  }
  return out;
}

// Cumulative sums over the groups, so that each band sits on the ones before it.
function stack(t, names, values) {
  let below = t.map(() => 0);
  const tops = [];
  for (const name of names) {
    const top = values[name].map((v, i) => below[i] + (v ?? 0));
    tops.push(top);
    below = top;
  }
  return tops;
}

function lines(history, names, fields, scale = 1) {
  const rows = [history.t];
  for (const field of fields) {
    for (const name of names) {
      rows.push(history.groups[name][field].map((v) => (v === null ? null : v * scale)));
    }
  }
  return rows;
}

// ---- charts -------------------------------------------------------------------

function chartSize(element) {
  return { width: Math.max(320, element.clientWidth || 480), height: 190 };
}

// Stacked bands of `names`, a grey band up to 100 % (`restLabel`), and
// optionally dashed lines (a group's limit on its band).
function stackedChart(element, names, yLabel, restLabel, limitNames = []) {
  const series = [{}];
  const bands = [];
  names.forEach((name, i) => {
    series.push({ label: name, stroke: colourOf(name), width: 1, fill: i === 0 ? fillOf(colourOf(name)) : undefined });
    if (i > 0) bands.push({ series: [i + 1, i], fill: fillOf(colourOf(name)) });
  });
  series.push({ label: restLabel, stroke: IDLE, width: 1, fill: names.length === 0 ? IDLE : undefined });
  if (names.length > 0) bands.push({ series: [names.length + 1, names.length], fill: IDLE });
  for (const name of limitNames) {
    series.push({ label: `${name} limit`, stroke: "#222", width: 2, dash: [6, 4] });
  }
  const options = {
    ...chartSize(element),
    series,
    bands,
    legend: { show: false },
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(100, max)] } },
    axes: [{}, { label: yLabel, size: 50 }],
  };
  return new uPlot(options, [[], ...series.slice(1).map(() => [])], element);
}

function lineChart(element, names, styles, yLabel) {
  const series = [{}];
  for (const style of styles) {
    for (const name of names) {
      series.push({ label: `${name} ${style.label}`, stroke: colourOf(name), dash: style.dash, width: 2 });
    }
  }
  const options = {
    ...chartSize(element),
    series,
    legend: { show: false },
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
    axes: [{}, { label: yLabel, size: 50 }],
  };
  return new uPlot(options, [[], ...series.slice(1).map(() => [])], element);
}

function buildCharts(names, tops, limited, cpus) {
  for (const chart of Object.values(dashboard.charts)) chart.destroy();
  $("#cpu-count").textContent = `${cpus} CPU${cpus === 1 ? "" : "s"}`;
  dashboard.charts = {
    cpuUsed: stackedChart($("#chart-cpu-used"), tops, `% of ${cpus} CPUs`, "idle", limited),
    cpuEntitled: stackedChart($("#chart-cpu-entitled"), tops, `% of ${cpus} CPUs`, "unclaimed"),
    queries: lineChart(
      $("#chart-queries"),
      names,
      [{ label: "active", dash: undefined }, { label: "queued", dash: [6, 4] }],
      "queries",
    ),
    wait: lineChart($("#chart-wait"), names, [{ label: "wait", dash: undefined }], "seconds"),
    memory: lineChart(
      $("#chart-memory"),
      names,
      [{ label: "used", dash: undefined }, { label: "limit", dash: [6, 4] }],
      "MiB",
    ),
  };
}

function drawCharts(fullHistory, groups, cpus) {
  const tree = dashboard.tree;
  const names = tree.map((node) => node.name).filter((name) => name in fullHistory.groups);
  // an inner group's CPU is its subtree's (SPEC §14): the stacks add up the top level
  const tops = tree.filter((node) => node.depth === 0 && node.name in fullHistory.groups).map((n) => n.name);
  const limits = Object.fromEntries(groups.map((g) => [g.name, g.cpu_limit_pct]));
  const limited = tops.filter((name) => limits[name] !== null && limits[name] !== undefined);
  const key = JSON.stringify([names, tops, limited, cpus]);
  if (key !== dashboard.chartsKey) {
    buildCharts(names, tops, limited, cpus);
    dashboard.chartsKey = key;
  }
  const history = windowed(fullHistory);
  const used = cpuUsed(history, tops, cpus);
  // the first sample of the window only anchors the first difference
  const cut = (values) => (history.dropFirst ? values.slice(1) : values);
  const t = cut(history.t);
  const usedTops = stack(history.t, tops, used).map(cut);
  const hundred = t.map(() => 100);
  const limitLines = limited.map((name) => {
    const below = tops.indexOf(name) === 0 ? t.map(() => 0) : usedTops[tops.indexOf(name) - 1];
    return below.map((v) => v + limits[name]);
  });
  const charts = dashboard.charts;
  charts.cpuUsed.setData([t, ...usedTops, hundred, ...limitLines]);
  dashboard.cpuSeries = Object.fromEntries(tops.map((name) => [name, cut(used[name])]));
  const entitled = Object.fromEntries(tops.map((n) => [n, history.groups[n].cpu_entitled_pct]));
  charts.cpuEntitled.setData([t, ...stack(history.t, tops, entitled).map(cut), hundred]);
  const trimmed = {
    t,
    groups: Object.fromEntries(
      names.map((name) => [
        name,
        Object.fromEntries(Object.entries(history.groups[name]).map(([f, v]) => [f, cut(v)])),
      ]),
    ),
  };
  charts.queries.setData(lines(trimmed, names, ["active_queries", "queued_queries"]));
  charts.wait.setData(lines(trimmed, names, ["oldest_queue_wait_millis"], 1 / 1000));
  // a limit of 0 is no limit: no line
  for (const name of names) {
    trimmed.groups[name].memory_limit_bytes = trimmed.groups[name].memory_limit_bytes.map((v) => (v ? v : null));
  }
  charts.memory.setData(lines(trimmed, names, ["memory_used_bytes", "memory_limit_bytes"], 1 / 1048576));
}

window.addEventListener("resize", () => {
  for (const chart of Object.values(dashboard.charts)) chart.setSize(chartSize(chart.root.parentNode));
});

// ---- the shared legend ----------------------------------------------------------

function drawLegend(tree) {
  const legend = $("#legend");
  const key = tree.map((n) => `${n.depth}:${n.name}`).join("\n");
  if (legend.dataset.key === key) return;
  legend.dataset.key = key;
  legend.replaceChildren();
  for (const node of tree) {
    const item = document.createElement("span");
    item.className = node.depth > 0 ? "item child" : "item";
    item.title = node.depth > 0 ? `${node.name} (under ${node.group.parent_group})` : node.name;
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = colourOf(node.name);
    item.append(swatch, document.createTextNode(node.name));
    legend.append(item);
  }
  const idle = document.createElement("span");
  idle.className = "item";
  idle.innerHTML = `<span class="swatch" style="background:${IDLE}"></span>idle / unclaimed`;
  const limit = document.createElement("span");
  limit.className = "item";
  limit.innerHTML = '<span class="dash"></span>CPU limit';
  legend.append(idle, limit);
}

// ---- tables, updated in place ---------------------------------------------

// Make `tbody` hold one row per item, keyed by `key`, in the items' order;
// rows that stay are updated cell by cell, so nothing flickers.
function syncRows(tbody, items, key, cells) {
  const existing = new Map([...tbody.rows].map((row) => [row.dataset.key, row]));
  items.forEach((item, index) => {
    const id = String(item[key]);
    let row = existing.get(id);
    if (row === undefined) {
      row = document.createElement("tr");
      row.dataset.key = id;
    }
    existing.delete(id);
    const values = cells(item, index);
    while (row.cells.length < values.length) row.insertCell();
    values.forEach((value, i) => {
      const cell = row.cells[i];
      const spec = typeof value === "object" && value !== null ? value : { text: value ?? "" };
      if (spec.html !== undefined) {
        if (cell.innerHTML !== spec.html) cell.innerHTML = spec.html;
      } else if (cell.textContent !== String(spec.text)) {
        cell.textContent = spec.text;
      }
      if (cell.className !== (spec.cls || "")) cell.className = spec.cls || "";
      if (spec.title !== undefined && cell.title !== spec.title) cell.title = spec.title;
    });
    if (tbody.rows[index] !== row) tbody.insertBefore(row, tbody.rows[index] || null);
  });
  for (const stale of existing.values()) stale.remove();
}

function memoryCell(group) {
  const used = group.memory_used_bytes;
  const limit = group.memory_limit_bytes;
  const pct = limit > 0 ? Math.min(100, (100 * used) / limit) : 0;
  const text = `${formatBytes(used)} / ${limit > 0 ? formatBytes(limit) : "no limit"}`;
  return {
    text,
    html: `<span class="bar"><div style="width:${pct.toFixed(1)}%"></div></span>${text}`,
  };
}

// The last second's CPU of every group, % of the CPUs (as the chart draws it).
function lastCpu(history, cpus) {
  const names = Object.keys(history.groups);
  const n = history.t.length;
  if (n < 2) return {};
  const last = { t: history.t.slice(n - 2), groups: {} };
  for (const name of names) {
    last.groups[name] = { cpu_nanos_total: (history.groups[name].cpu_nanos_total || []).slice(n - 2) };
  }
  const used = cpuUsed(last, names, cpus);
  return Object.fromEntries(names.map((name) => [name, used[name][1]]));
}

function drawGroups(tree, history, cpus) {
  const lastUsed = history ? lastCpu(history, cpus) : {};
  syncRows($("#groups tbody"), tree, "name", (node) => {
    const g = node.group;
    const indent = node.depth > 0 ? `<span class="indent" style="width:${node.depth * 1.2}em"></span>↳ ` : "";
    return [
      {
        text: g.name,
        html: `${indent}<span class="swatch" style="background:${colourOf(g.name)}"></span>${escapeHtml(g.name)}`,
        cls: node.depth > 0 ? "child" : "",
      },
      { text: g.active_queries, cls: "num" },
      { text: g.queued_queries, cls: "num" },
      { text: formatMillis(g.oldest_queue_wait_millis), cls: "num" },
      { text: formatPct(lastUsed[g.name] ?? null), cls: "num" },
      { text: formatPct(g.cpu_limit_pct), cls: "num" },
      { text: formatPct(g.cpu_entitled_pct), cls: "num" },
      memoryCell(g),
    ];
  });
}

const STATEMENT_CHARS = 120;

function drawQueries(queries) {
  syncRows($("#queries tbody"), queries, "query_id", (q) => {
    const statement = q.statement ?? "";
    const shown = statement.length > STATEMENT_CHARS ? `${statement.slice(0, STATEMENT_CHARS)}…` : statement;
    return [
      { text: q.query_id, cls: "num" },
      { text: shown, cls: "statement", title: statement },
      { text: q.stalled ? `${q.state} (stalled)` : q.state, cls: q.stalled ? "stalled" : `state-${q.state}` },
      q.blocked_by ?? "",
      { text: formatMillis(q.waited_millis), cls: "num" },
      q.resource_group ?? "",
      q.user_name,
    ];
  });
  $("#no-queries").hidden = queries.length > 0;
}

function escapeHtml(text) {
  const span = document.createElement("span");
  span.textContent = text;
  return span.innerHTML;
}

// ---- the window the user chooses ------------------------------------------------

function setupWindow() {
  const select = $("#window");
  for (const seconds of WINDOWS) {
    const option = document.createElement("option");
    option.value = String(seconds);
    option.textContent = seconds < 60 ? `last ${seconds} s` : `last ${seconds / 60} min`;
    select.append(option);
  }
  const asked = Number(new URLSearchParams(location.search).get("window"));
  dashboard.windowSeconds = WINDOWS.includes(asked) ? asked : 300;
  select.value = String(dashboard.windowSeconds);
  select.addEventListener("change", () => {
    dashboard.windowSeconds = Number(select.value);
    if (dashboard.state) draw(dashboard.state);
  });
}

// ---- the refresh loop ---------------------------------------------------------

function draw(state) {
  $("#user").textContent = state.user ? `as ${state.user}` : "";
  const notice = $("#notice");
  notice.hidden = !state.notice;
  notice.textContent = state.notice ?? "";
  const canSeeGroups = state.groups !== null;
  $("#charts").hidden = !canSeeGroups;
  $("#legend").hidden = !canSeeGroups;
  $("#groups-section").hidden = !canSeeGroups;
  if (canSeeGroups) {
    const cpus = state.cpus || 1;
    dashboard.tree = groupTree(state.groups);
    for (const node of dashboard.tree) colourOf(node.name);
    drawLegend(dashboard.tree);
    drawGroups(dashboard.tree, state.history, cpus);
    if (state.history.t.length > 0) drawCharts(state.history, state.groups, cpus);
  }
  drawQueries(state.queries);
  const status = $("#status");
  status.className = "";
  status.dataset.updated = String(state.now);
  status.textContent = `updated ${new Date(state.now * 1000).toLocaleTimeString()}`;
}

async function refresh() {
  try {
    const response = await fetch("/api/state", { cache: "no-store", credentials: "same-origin" });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
    dashboard.state = body;
    draw(body);
    dashboard.updates += 1;
  } catch (error) {
    dashboard.failures += 1;
    const status = $("#status");
    status.className = "error";
    status.textContent = `not updated: ${error.message}`;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

setupWindow();
refresh();
