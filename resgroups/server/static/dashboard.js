// The live page of `resgroups serve`: reads /api/state every second and
// updates the charts (uPlot) and the tables in place. Plain JavaScript, no
// build step; every request goes to the server that served the page.
"use strict";

const REFRESH_MS = 1000;
const COLORS = [
  "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
];

// What the page knows, for the curious (and for the tests): the last state,
// the charts, how many updates it has drawn.
const dashboard = { state: null, charts: {}, groupNames: "", updates: 0, failures: 0 };
window.dashboard = dashboard;

const colorOf = (i) => COLORS[i % COLORS.length];
const $ = (selector) => document.querySelector(selector);

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

// ---- charts ---------------------------------------------------------------

// Cumulative sums of one series over the groups, so that each group's band
// sits on the ones before it (a stacked area chart).
function stacked(history, names, field) {
  let below = history.t.map(() => 0);
  const rows = [history.t];
  for (const name of names) {
    const values = history.groups[name][field];
    const top = values.map((v, i) => below[i] + (v ?? 0));
    rows.push(top);
    below = top;
  }
  return rows;
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

function chartSize(element) {
  return { width: Math.max(320, element.clientWidth || 480), height: 200 };
}

function stackedChart(element, names, yLabel) {
  const series = [{}];
  const bands = [];
  names.forEach((name, i) => {
    series.push({ label: name, stroke: colorOf(i), fill: i === 0 ? `${colorOf(i)}99` : undefined });
    if (i > 0) bands.push({ series: [i + 1, i], fill: `${colorOf(i)}99` });
  });
  const options = {
    ...chartSize(element),
    series,
    bands,
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(100, max)] } },
    axes: [{}, { label: yLabel }],
  };
  return new uPlot(options, [[], ...names.map(() => [])], element);
}

function lineChart(element, names, styles, yLabel) {
  const series = [{}];
  for (const style of styles) {
    names.forEach((name, i) => {
      series.push({ label: `${name} ${style.label}`, stroke: colorOf(i), dash: style.dash, width: 2 });
    });
  }
  const options = {
    ...chartSize(element),
    series,
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
    axes: [{}, { label: yLabel }],
  };
  return new uPlot(options, [[], ...series.slice(1).map(() => [])], element);
}

function buildCharts(names) {
  for (const chart of Object.values(dashboard.charts)) chart.destroy();
  dashboard.charts = {
    cpuUsed: stackedChart($("#chart-cpu-used"), names, "% of the CPUs"),
    cpuEntitled: stackedChart($("#chart-cpu-entitled"), names, "% entitled"),
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

function drawCharts(history) {
  const names = Object.keys(history.groups);
  const key = names.join("\n");
  if (key !== dashboard.groupNames) {
    buildCharts(names);
    dashboard.groupNames = key;
  }
  const charts = dashboard.charts;
  charts.cpuUsed.setData(stacked(history, names, "cpu_used_pct"));
  charts.cpuEntitled.setData(stacked(history, names, "cpu_entitled_pct"));
  charts.queries.setData(lines(history, names, ["active_queries", "queued_queries"]));
  charts.wait.setData(lines(history, names, ["oldest_queue_wait_millis"], 1 / 1000));
  // a limit of 0 is no limit: no line
  const limited = {
    t: history.t,
    groups: Object.fromEntries(
      names.map((name) => [
        name,
        {
          ...history.groups[name],
          memory_limit_bytes: history.groups[name].memory_limit_bytes.map((v) => (v ? v : null)),
        },
      ]),
    ),
  };
  charts.memory.setData(
    lines(limited, names, ["memory_used_bytes", "memory_limit_bytes"], 1 / 1048576),
  );
}

window.addEventListener("resize", () => {
  for (const chart of Object.values(dashboard.charts)) chart.setSize(chartSize(chart.root.parentNode));
});

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
      const spec = typeof value === "object" ? value : { text: value };
      if (spec.html !== undefined) {
        if (cell.innerHTML !== spec.html) cell.innerHTML = spec.html;
      } else if (cell.textContent !== String(spec.text)) {
        cell.textContent = spec.text;
      }
      if (cell.className !== (spec.cls || "")) cell.className = spec.cls || "";
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

function drawGroups(groups) {
  syncRows($("#groups tbody"), groups, "name", (g, i) => [
    { text: g.name, html: `<span class="swatch" style="background:${colorOf(i)}"></span>${escapeHtml(g.name)}` },
    { text: g.active_queries, cls: "num" },
    { text: g.queued_queries, cls: "num" },
    { text: formatMillis(g.oldest_queue_wait_millis), cls: "num" },
    { text: formatPct(g.cpu_used_pct), cls: "num" },
    { text: formatPct(g.cpu_entitled_pct), cls: "num" },
    memoryCell(g),
  ]);
}

function drawQueries(queries) {
  syncRows($("#queries tbody"), queries, "query_id", (q) => [
    { text: q.query_id, cls: "num" },
    { text: q.stalled ? `${q.state} (stalled)` : q.state, cls: q.stalled ? "stalled" : `state-${q.state}` },
    q.blocked_by ?? "",
    { text: formatMillis(q.waited_millis), cls: "num" },
    q.resource_group ?? "",
    q.user_name,
  ]);
  $("#no-queries").hidden = queries.length > 0;
}

function escapeHtml(text) {
  const span = document.createElement("span");
  span.textContent = text;
  return span.innerHTML;
}

// ---- the refresh loop ---------------------------------------------------------

function draw(state) {
  $("#user").textContent = state.user ? `as ${state.user}` : "";
  const notice = $("#notice");
  notice.hidden = !state.notice;
  notice.textContent = state.notice ?? "";
  const canSeeGroups = state.groups !== null;
  $("#charts").hidden = !canSeeGroups;
  $("#groups-section").hidden = !canSeeGroups;
  if (canSeeGroups) {
    drawGroups(state.groups);
    if (state.history.t.length > 0) drawCharts(state.history);
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

refresh();
