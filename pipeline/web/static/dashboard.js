/* freshkey dashboard: polls the worker's JSON every second and draws it with uPlot (vendored, MIT).
 *
 * Reads /freshkey/api/series (per-second points, last-minute summary, the lag figures of every window the
 * worker reports, consumer lag, which optional routes exist), /freshkey/stats, and /freshkey/sla and
 * /freshkey/verify when the worker has them. Every lag figure comes from the worker's one lag sketch and
 * says its window: the chart's percentiles are per second; the tiles and the SLA card show the SLA's
 * window (the same figures: whole seconds up to the one stated), 60 s without an SLA.
 * window.__freshkey exposes what is drawn (for the browser test and for debugging from the console).
 */
(function () {
  "use strict";

  const POLL_MS = 1000;
  const DEFAULT_WINDOW_S = 60;
  const CHART_HEIGHT = 230;
  const STAGE_TOTAL = "commit->applied";
  const LAG_SERIES = [
    ["p50", "#38bdf8", 2],
    ["p95", "#a78bfa", 1.5],
    ["p99", "#fbbf24", 2],
    ["max", "#f43f5e", 1],
  ];
  const STAGE_COLORS = ["#38bdf8", "#34d399", "#a78bfa", "#fbbf24", "#f472b6", "#22d3ee", "#fb923c", "#94a3b8"];
  // Drawn in this order (each bar is the sum of itself and those after it), so the stack reads, bottom
  // up: dead-lettered, not newer (refused: a replay or overtaken), tombstoned, applied; the rare outcomes
  // sit on the axis where they show.
  const OUTCOMES = [
    ["applied", "#34d399"],
    ["tombstoned", "#a78bfa"],
    ["not_newer", "#fbbf24"],
    ["dead-lettered", "#f43f5e"],
  ];
  const AXIS = {
    stroke: "#8a9bb8",
    grid: { stroke: "rgba(148,163,184,0.12)", width: 1 },
    ticks: { stroke: "rgba(148,163,184,0.25)", width: 1, size: 4 },
    font: "11px system-ui, sans-serif",
    labelFont: "12px system-ui, sans-serif",
  };

  const $ = (id) => document.getElementById(id);
  const store = (key, fallback) => {
    try { return window.localStorage.getItem("freshkey." + key) || fallback; } catch (e) { return fallback; }
  };
  const save = (key, value) => {
    try { window.localStorage.setItem("freshkey." + key, value); } catch (e) { /* private mode */ }
  };

  const state = {
    windowS: Number(store("window", "300")),
    scales: { lag: store("scale.lag", "log"), stages: store("scale.stages", "log") },
    points: new Map(),
    stages: [],
    lastT: null,
    now: null,
    startedAt: null,
    retentionS: 900,
    summary: null,
    windows: {},
    consumer: [],
    routes: { sla: true, verify: true },
    stats: null,
    sla: undefined,
    verify: undefined,
    charts: {},
    failures: 0,
  };

  const exposed = {
    updates: 0,
    lagPoints: 0,
    stagePoints: 0,
    outcomePoints: 0,
    outcomes: { applied: 0, tombstoned: 0, not_newer: 0, "dead-lettered": 0 },
    tiles: null,
    slaFigures: null,
    sla: null,
    verify: null,
    consumerPartitions: 0,
    consumerUnknown: 0,
    slaTargets: {},
    lastError: null,
  };
  window.__freshkey = exposed;

  // ---------------------------------------------------------------------------------------------------
  // formatting

  function fmtMs(v) {
    if (v == null || !isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a >= 10000) return (v / 1000).toFixed(1) + " s";
    if (a >= 1000) return (v / 1000).toFixed(2) + " s";
    if (a >= 100) return v.toFixed(0) + " ms";
    if (a >= 10) return v.toFixed(1) + " ms";
    if (a >= 1) return v.toFixed(2) + " ms";
    return v.toFixed(3) + " ms";
  }
  // A figure shown beside a threshold keeps its comparison with it: 200.0004 against 200 reads
  // "200.0004 ms", never "200 ms" (which would read as met).
  function fmtMsAgainst(v, threshold) {
    const text = fmtMs(v);
    if (threshold == null || v == null || !isFinite(v)) return text;
    const shown = parseFloat(text) * (text.endsWith(" s") ? 1000 : 1);
    if ((shown <= threshold) === (v <= threshold)) return text;
    for (let d = 1; d <= 6; d++) {
      const t = v.toFixed(d);
      if ((parseFloat(t) <= threshold) === (v <= threshold)) return t + " ms";
    }
    return String(v) + " ms";
  }
  function fmtWindow(seconds) {
    if (seconds == null) return "since start";
    return seconds >= 120 && seconds % 60 === 0 ? "last " + seconds / 60 + " min" : "last " + seconds + " s";
  }
  function fmtAxisMs(v) {
    if (v == null) return "";
    const a = Math.abs(v);
    if (a >= 1000) return +(v / 1000).toFixed(2) + " s";
    if (a >= 1 || a === 0) return +v.toFixed(1) + "";
    return +v.toPrecision(2) + "";
  }
  function fmtCount(v) {
    if (v == null || !isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(2) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
    if (Number.isInteger(v)) return String(v);
    if (a >= 100) return v.toFixed(0);
    return String(+v.toPrecision(4));
  }
  function tileMs(el, v, threshold) {
    if (v == null || !isFinite(v)) { el.textContent = "–"; return; }
    const text = fmtMsAgainst(v, threshold);
    const unit = text.endsWith(" ms") ? "ms" : "s";
    el.innerHTML = "";
    el.append(text.slice(0, -unit.length - 1));
    const u = document.createElement("span");
    u.className = "unit";
    u.textContent = unit;
    el.append(u);
  }
  function stageLabel(stage) {
    return stage.replace("planned->tier:", "planned → tier ").replace(/->/g, " → ");
  }
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k === "style") node.style.cssText = v;
      else node.setAttribute(k, v);
    }
    for (const c of children) if (c != null) node.append(c);
    return node;
  }
  function clock(t) {
    return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
  }

  // ---------------------------------------------------------------------------------------------------
  // data

  async function getJSON(url) {
    const response = await fetch(url, { cache: "no-store", headers: { Accept: "application/json" } });
    if (response.status === 401) {
      // The worker wants its token (FRESHKEY_WORKER_WEB_TOKEN) and this browser's session is gone (a
      // restart with another token): log in again, then come back here.
      window.location.assign("/freshkey/login?next=" + encodeURIComponent(location.pathname + location.search));
      throw new Error(url + ": HTTP 401 (logging in)");
    }
    if (response.status === 404) return { status: 404, data: null };
    if (!response.ok) throw new Error(url + ": HTTP " + response.status);
    return { status: response.status, data: await response.json() };
  }

  async function optional(name) {
    // A route the worker does not have is "not configured", without a request that would 404.
    if (!state.routes[name]) return null;
    try {
      const got = await getJSON("/freshkey/" + name);
      return got.status === 404 ? null : got.data;
    } catch (e) {
      return state[name] === undefined ? null : state[name];
    }
  }

  function merge(series) {
    for (const p of series.points) state.points.set(p.t, p);
    if (series.points.length) {
      const last = series.points[series.points.length - 1].t;
      state.lastT = state.lastT == null ? last : Math.max(state.lastT, last);
    }
    state.now = series.now;
    state.startedAt = series.started_at;
    state.retentionS = series.retention_s;
    state.stages = series.stages;
    state.summary = series.summary;
    state.windows = series.windows || {};
    state.consumer = series.consumer || [];
    state.routes = Object.assign({ sla: true, verify: true }, series.routes || {});
    const oldest = Math.floor(series.now) - series.retention_s;
    for (const t of state.points.keys()) if (t <= oldest) state.points.delete(t);
  }

  async function tick() {
    try {
      // The last second seen may have been partial: ask for it again.
      const since = state.lastT == null ? "" : "?since=" + state.lastT;
      const series = await getJSON("/freshkey/api/series" + since);
      if (!series.data) throw new Error("/freshkey/api/series: HTTP 404");
      merge(series.data);
      const [stats, sla, verify] = await Promise.all([
        getJSON("/freshkey/stats").then((r) => r.data),
        optional("sla"),
        optional("verify"),
      ]);
      state.stats = stats;
      state.sla = sla;
      state.verify = verify;
      state.failures = 0;
      setConnection(true);
    } catch (e) {
      state.failures += 1;
      exposed.lastError = String(e && e.message ? e.message : e);
      setConnection(false);
    }
    try {
      render();
      exposed.updates += 1;
    } catch (e) {
      exposed.lastError = "render: " + (e && e.stack ? e.stack : e);
      console.warn("freshkey dashboard: render failed", e);
    }
    window.setTimeout(tick, POLL_MS);
  }

  function setConnection(ok) {
    const conn = $("conn");
    if (ok) {
      conn.className = "conn conn-live";
      $("conn-text").textContent = "live · " + clock(state.now);
    } else if (state.failures > 0) {
      conn.className = "conn conn-down";
      $("conn-text").textContent = "worker unreachable · retrying";
    }
  }

  // ---------------------------------------------------------------------------------------------------
  // charts

  function timeline() {
    // The current second is still filling up: end at the last complete one. A worker up for less than
    // the window gets its lifetime (at least 30 s) rather than a chart that is mostly empty.
    const end = Math.floor(state.now) - 1;
    const born = state.startedAt == null ? -Infinity : Math.floor(state.startedAt);
    const start = Math.max(end - state.windowS + 1, Math.min(born, end - 29));
    const xs = [];
    for (let t = start; t <= end; t++) xs.push(t);
    return xs;
  }

  // Log axes: grid lines at powers of ten only (with 2 and 5 when the range spans under two decades).
  function logSplits(u, axisIdx, min, max) {
    if (!(min > 0) || !(max > 0)) return [];
    const lo = Math.floor(Math.log10(min));
    const hi = Math.ceil(Math.log10(max));
    const steps = hi - lo < 3 ? [1, 2, 5] : [1];
    const splits = [];
    for (let e = lo; e <= hi; e++) {
      for (const m of steps) {
        const v = m * Math.pow(10, e);
        if (v >= min * 0.999 && v <= max * 1.001) splits.push(+v.toPrecision(3));
      }
    }
    return splits;
  }

  // Whole decades around the data, so no line is clipped at an edge.
  function logRange(u, min, max) {
    if (!(min > 0) || !(max > 0)) return [1, 1000];
    const lo = Math.pow(10, Math.floor(Math.log10(min)));
    let hi = Math.pow(10, Math.ceil(Math.log10(max)));
    if (hi <= lo) hi = lo * 10;
    return [lo, hi];
  }

  function baseOptions(container, yLabel, log, series, extra) {
    const yAxis = Object.assign({}, AXIS, {
      label: yLabel,
      size: 58,
      values: (u, splits) => splits.map(fmtAxisMs),
    });
    if (log) yAxis.splits = logSplits;
    return Object.assign(
      {
        width: Math.max(container.clientWidth, 200),
        height: CHART_HEIGHT,
        cursor: { drag: { x: false, y: false }, points: { size: 6 } },
        scales: {
          x: { time: true },
          y: log
            ? { distr: 3, log: 10, range: logRange }
            : { range: (u, min, max) => [0, max > 0 ? max * 1.08 : 1] },
        },
        axes: [Object.assign({}, AXIS, { space: 70 }), yAxis],
        legend: { live: true },
        series: [{ label: "time", value: (u, v) => (v == null ? "–" : clock(v)) }].concat(series),
      },
      extra || {}
    );
  }

  function chart(name, signature, makeOptions, data) {
    const container = $("chart-" + name);
    let entry = state.charts[name];
    if (!entry || entry.signature !== signature) {
      if (entry) entry.plot.destroy();
      const plot = new uPlot(makeOptions(container), data, container);
      entry = state.charts[name] = { plot: plot, signature: signature };
      new ResizeObserver(() => {
        const width = Math.max(container.clientWidth, 200);
        if (state.charts[name] === entry && width !== entry.plot.width) {
          entry.plot.setSize({ width: width, height: CHART_HEIGHT });
        }
      }).observe(container);
    } else {
      entry.plot.setData(data);
    }
    return entry.plot;
  }

  function latest(u, si) {
    const column = u.data[si] || [];
    for (let i = column.length - 1; i >= 0; i--) if (column[i] != null) return column[i];
    return null;
  }
  // Legend value: the hovered second's, else the latest one.
  const legendMs = (u, v, si, idx) => fmtMs(idx == null ? latest(u, si) : v);

  function markPoints(name, count) {
    const container = $("chart-" + name);
    container.dataset.points = String(count);
    container.classList.toggle("has-data", count > 0);
  }

  function renderLag(xs) {
    const log = state.scales.lag === "log";
    const target = slaTargetMs();
    const columns = LAG_SERIES.map(([key]) =>
      xs.map((t) => {
        const p = state.points.get(t);
        const v = p && p.lag_ms ? p.lag_ms[key] : null;
        return v == null || (log && v <= 0) ? null : v;
      })
    );
    const count = columns[0].filter((v) => v != null).length;
    const series = LAG_SERIES.map(([key, color, width]) => ({
      label: key,
      stroke: color,
      width: width,
      spanGaps: false,
      points: { show: count < 3 },
      value: legendMs,
    }));
    const data = [xs].concat(columns);
    if (target != null) {
      series.push({
        label: "p99 target", stroke: "#f43f5e", dash: [6, 4], width: 1, points: { show: false }, value: () => fmtMs(target),
      });
      data.push(xs.map(() => target));
    }
    chart("lag", state.scales.lag + "|" + (target != null), (c) => baseOptions(c, "lag (ms)", log, series), data);
    markPoints("lag", count);
    exposed.lagPoints = count;
    const coarse = state.summary ? state.summary.coarse_lag_samples : 0;
    $("lag-coarse").textContent = coarse
      ? " · " + fmtCount(coarse) + (coarse === 1 ? " change" : " changes") + " in the " +
        fmtWindow(state.summary.window_s) + " had only the 1-s binlog clock (not charted)"
      : "";
  }

  function renderStages(xs) {
    const log = state.scales.stages === "log";
    const stages = state.stages.filter((s) => s !== STAGE_TOTAL);
    const columns = stages.map((stage) =>
      xs.map((t) => {
        const p = state.points.get(t);
        const s = p && p.stages_ms ? p.stages_ms[stage] : null;
        const v = s ? s.p50 : null;
        return v == null || (log && v <= 0) ? null : v;
      })
    );
    const count = xs.filter((_, i) => columns.some((c) => c[i] != null)).length;
    const series = stages.map((stage, i) => ({
      label: stageLabel(stage),
      stroke: STAGE_COLORS[i % STAGE_COLORS.length],
      width: 1.75,
      spanGaps: false,
      points: { show: count < 3 },
      value: legendMs,
    }));
    chart("stages", state.scales.stages + "|" + stages.join(","), (c) => baseOptions(c, "p50 (ms)", log, series), [xs].concat(columns));
    markPoints("stages", count);
    exposed.stagePoints = count;
    renderBreakdown(stages);
  }

  function renderBreakdown(stages) {
    const box = $("breakdown");
    const summary = state.summary && state.summary.stages_ms;
    $("breakdown-window").textContent = fmtWindow(state.summary ? state.summary.window_s : DEFAULT_WINDOW_S);
    const parts = stages
      .map((stage, i) => ({ stage: stage, color: STAGE_COLORS[i % STAGE_COLORS.length], s: summary && summary[stage] }))
      .filter((p) => p.s && p.s.p50 != null);
    box.innerHTML = "";
    const legendOld = box.nextElementSibling;
    if (legendOld && legendOld.classList.contains("breakdown-legend")) legendOld.remove();
    if (!parts.length) {
      box.append(el("span", { class: "muted", style: "padding: 6px 8px" }, "waiting for data"));
      return;
    }
    const total = parts.reduce((a, p) => a + Math.max(p.s.p50, 0), 0) || 1;
    const legend = el("div", { class: "breakdown-legend" });
    for (const p of parts) {
      const share = Math.max(p.s.p50, 0) / total;
      const seg = el("div", {
        class: "seg",
        style: "flex: " + Math.max(share, 0.004) + " 1 0; background: " + p.color,
        title: stageLabel(p.stage) + ": p50 " + fmtMs(p.s.p50) + ", p99 " + fmtMs(p.s.p99),
      }, share > 0.12 ? fmtMs(p.s.p50) : "");
      box.append(seg);
      legend.append(
        el("span", {}, el("span", { class: "sw", style: "background:" + p.color }), stageLabel(p.stage) + " ",
          el("span", { class: "muted num" }, fmtMs(p.s.p50) + " · p99 " + fmtMs(p.s.p99)))
      );
    }
    box.after(legend);
  }

  function renderOutcomes(xs) {
    const raw = OUTCOMES.map(([key]) =>
      xs.map((t) => {
        const p = state.points.get(t);
        if (!p) return 0;
        return key === "dead-lettered" ? p.events.dead_lettered || 0 : p.outcomes[key] || 0;
      })
    );
    const stacked = raw.map((col, i) => col.map((_, j) => raw.slice(i).reduce((a, c) => a + c[j], 0)));
    const count = xs.filter((_, j) => stacked[0][j] > 0).length;
    const totals = {};
    OUTCOMES.forEach(([key], i) => { totals[key] = raw[i].reduce((a, b) => a + b, 0); });
    const bars = uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.85, 24], gap: 0 }) : undefined;
    const series = OUTCOMES.map(([key, color], i) => ({
      label: key,
      stroke: color,
      fill: color + "d0",
      width: 0,
      paths: bars,
      points: { show: false },
      value: (u, v, si, idx) => (idx == null ? fmtCount(totals[key]) : fmtCount(raw[i][idx])),
    }));
    const options = (c) => {
      const o = baseOptions(c, "actions / s", false, series);
      o.axes[1].values = (u, splits) => splits.map((v) => fmtCount(v));
      return o;
    };
    chart("outcomes", "bars", options, [xs].concat(stacked));
    markPoints("outcomes", count);
    exposed.outcomePoints = count;
    exposed.outcomes = totals;
  }

  // ---------------------------------------------------------------------------------------------------
  // panels

  // SLA state (pipeline/observe/sla_state.py SlaState): {status, targets: [{name, status, threshold,
  // measured, unit, detail, since_ms}], p50_ms, p99_ms, samples, evaluation_window_s, violations, last_event}.
  const TARGET_LABELS = {
    p99_lag: "p99 commit → cache lag",
    consistency_window: "changes within the window",
    heartbeat: "heartbeat overdue",
    backlog_age: "oldest waiting change",
  };

  function slaTargets(sla) {
    return sla && Array.isArray(sla.targets) ? sla.targets : [];
  }

  function slaTargetMs() {
    const t = slaTargets(state.sla).find((x) => x.name === "p99_lag");
    return t && typeof t.threshold === "number" ? t.threshold : null;
  }

  // The window of the tiles: the SLA's (so tiles and SLA card show the same figures), else 60 s.
  function lagWindowS() {
    const s = state.sla && typeof state.sla.evaluation_window_s === "number" ? state.sla.evaluation_window_s : null;
    return s != null && state.windows["last_" + s + "s"] ? s : DEFAULT_WINDOW_S;
  }

  function clockMs(ms) {
    return ms == null ? "" : clock(ms / 1000);
  }

  function statusClass(status) {
    return status === "ok" ? "badge-ok" : status === "violated" ? "badge-bad" : "badge-neutral";
  }

  function statusText(status) {
    return status === "no_data" ? "no data" : String(status || "unknown");
  }

  function fmtTargetValue(v, unit, threshold) {
    if (v == null) return "–";
    if (unit === "fraction") return +(v * 100).toFixed(v >= 0.99 ? 4 : 2) + " %";
    if (unit === "ms") return fmtMsAgainst(v, threshold);
    return fmtCount(v) + (unit ? " " + unit : "");
  }

  function kvList(obj, skip) {
    const dl = el("dl", { class: "kv" });
    for (const [k, v] of Object.entries(obj)) {
      if (skip && skip.includes(k)) continue;
      if (v !== null && typeof v === "object") continue;
      const text = typeof v === "number" && /_ms$/.test(k) ? fmtMs(v) : typeof v === "number" ? fmtCount(v) : String(v);
      dl.append(el("dt", {}, k.replace(/_/g, " ")), el("dd", {}, text));
    }
    return dl;
  }

  function ago(ms) {
    if (ms == null || state.now == null) return "";
    const s = Math.max(0, state.now - ms / 1000);
    if (s < 90) return Math.round(s) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    return Math.round(s / 3600) + " h ago";
  }

  function renderSla() {
    const badge = $("sla-badge");
    const stateBadge = $("sla-state");
    const body = $("sla-body");
    body.innerHTML = "";
    const sla = state.sla;
    if (!sla) {
      badge.className = stateBadge.className = "badge badge-neutral";
      badge.textContent = "SLA: not configured";
      stateBadge.textContent = "not configured";
      body.append(el("div", { class: "muted" }, "SLA: not configured"),
        el("div", { class: "note" }, "This worker serves no /freshkey/sla; lag percentiles are still charted above."));
      exposed.sla = "not configured";
      return;
    }
    const status = sla.status || (sla.ok === true ? "ok" : sla.ok === false ? "violated" : "unknown");
    badge.className = stateBadge.className = "badge " + statusClass(status);
    badge.textContent = "SLA: " + statusText(status);
    stateBadge.textContent = statusText(status) + (sla.since_ms ? " · " + ago(sla.since_ms) : "");
    exposed.sla = statusText(status);
    const targets = slaTargets(sla);
    exposed.slaTargets = Object.fromEntries(targets.map((t) => [t.name, t.status]));
    if (sla.samples != null && sla.evaluation_window_s != null) {
      const target = slaTargetMs();
      const figures = { window_s: sla.evaluation_window_s, end_ms: sla.window_end_ms, p50: sla.p50_ms, p99: sla.p99_ms, max: sla.max_ms };
      exposed.slaFigures = figures;
      body.append(el("div", { class: "note", style: "margin: 0 0 8px", id: "sla-figures" },
        "lag p50 " + fmtMsAgainst(figures.p50, target) + " · p99 " + fmtMsAgainst(figures.p99, target) + " · max " +
        fmtMsAgainst(figures.max, target) + " · " + fmtWindow(figures.window_s) +
        (figures.end_ms ? " to " + clockMs(figures.end_ms) : "")));
    }
    if (targets.length) {
      const table = el("table", { class: "data" });
      table.append(el("tr", {}, el("th", {}, "target"), el("th", { class: "r" }, "promise"),
        el("th", { class: "r" }, "measured"), el("th", { class: "r" }, "")));
      for (const t of targets) {
        const promise = (t.name === "consistency_window" ? "≥ " : "≤ ") + fmtTargetValue(t.threshold, t.unit);
        table.append(el("tr", { title: t.detail || "" },
          el("td", {}, TARGET_LABELS[t.name] || String(t.name).replace(/_/g, " ")),
          el("td", { class: "r" }, promise),
          el("td", { class: "r" + (t.status === "violated" ? " bad" : "") }, fmtTargetValue(t.measured, t.unit, t.threshold)),
          el("td", { class: "r" }, el("span", { class: "badge " + statusClass(t.status) }, statusText(t.status)))));
      }
      body.append(table);
      // What a violated target says is why: show it, not only in the row's tooltip.
      for (const t of targets) {
        if (t.status === "violated" && t.detail) {
          body.append(el("div", { class: "note bad" }, (TARGET_LABELS[t.name] || t.name) + ": " + t.detail));
        }
      }
    } else {
      body.append(kvList(sla, ["status", "ok"]));
    }
    const facts = [];
    if (sla.evaluation_window_s != null) facts.push("sliding window " + fmtCount(sla.evaluation_window_s) + " s");
    if (sla.samples != null) facts.push(fmtCount(sla.samples) + " samples");
    if (sla.unknown_partitions) facts.push(fmtCount(sla.unknown_partitions) + " partition" + (sla.unknown_partitions === 1 ? "" : "s") + " unknown");
    if (sla.violations != null) facts.push(fmtCount(sla.violations) + " violation" + (sla.violations === 1 ? "" : "s") + " since start");
    if (facts.length) body.append(el("div", { class: "note" }, facts.join(" · ")));
    if (sla.last_event && sla.last_event.message) {
      body.append(el("div", { class: "note " + (sla.last_event.kind === "violation" ? "bad" : "ok") },
        "last: " + sla.last_event.message + " (" + ago(sla.last_event.at_ms) + ")"));
    }
  }

  // Consumer lag rows: pipeline/observe/partitions.py PartitionProgress ({topic, partition, state, assigned, lag, age_ms,
  // acked_offset, highwater, committed_offset, reason, ...}), or, from an older worker, {topic, partition,
  // acked_offset, highwater, lag, assigned} without a state. A lag of null is unknown, never "caught up".
  const CONSUMER_STATES = { caught_up: "caught up", behind: "behind", stalled: "stalled", unknown: "unknown" };

  function rowState(r) {
    if (r.state) return r.state;
    return r.lag == null ? "unknown" : r.lag > 0 ? "behind" : "caught_up";
  }

  function renderConsumer() {
    const body = $("consumer-body");
    body.innerHTML = "";
    const rows = state.consumer;
    exposed.consumerPartitions = rows.length;
    exposed.consumerUnknown = rows.filter((r) => rowState(r) === "unknown").length;
    if (!rows.length) {
      body.append(el("span", { class: "muted" }, "waiting for data (no partition assigned or acknowledged yet)"));
      return;
    }
    const maxLag = Math.max(1, ...rows.map((r) => r.lag || 0));
    const topics = new Set(rows.map((r) => r.topic));
    const withAge = rows.some((r) => "age_ms" in r);
    const table = el("table", { class: "data" });
    // With the age column the card is one column wider: shorter headers (the hint above says what they are).
    table.append(el("tr", {}, el("th", {}, "partition"), el("th", { class: "r" }, withAge ? "acked" : "acked offset"),
      el("th", { class: "r" }, withAge ? "high" : "high watermark"), el("th", { class: "r" }, "lag"),
      withAge ? el("th", { class: "r", title: "how long the oldest change not yet applied has waited" }, "oldest") : null,
      el("th", {}, "")));
    for (const r of rows) {
      const st = rowState(r);
      const unknown = st === "unknown";
      const lagText = unknown ? "unknown" : fmtCount(r.lag);
      const lagClass = unknown || st === "stalled" ? " bad" : r.lag > 0 ? " warn" : "";
      const bar = el("div", { class: "bar" + (r.lag > 0 || st === "stalled" ? " bad" : "") },
        el("span", { style: "width:" + (r.lag == null ? 0 : Math.max(r.lag > 0 ? 3 : 0, (100 * r.lag) / maxLag)) + "%" }));
      const label = r.partition == null ? "?" : String(r.partition);
      const name = topics.size > 1 ? r.topic + " [" + label + "]" : label;
      const title = r.reason || (r.assigned === false && !r.state ? "not assigned to this worker (offsets as last acknowledged here)" : "");
      const tag = unknown ? " unknown" : st === "stalled" ? " stalled" : r.assigned === false ? " idle" : "";
      const age = r.age_ms == null ? (r.group_age_ms != null ? "≥ " + fmtMs(r.group_age_ms) + " (group)" : "–")
        : r.age_ms === 0 ? "0" : fmtMs(r.age_ms);
      table.append(el("tr", { title: title, "data-state": st },
        el("td", {}, name, tag ? el("span", { class: unknown || st === "stalled" ? "bad" : "muted" }, tag) : null),
        el("td", { class: "r" }, r.acked_offset == null ? "n/a" : String(r.acked_offset)),
        el("td", { class: "r" }, r.highwater == null ? "n/a" : String(r.highwater)),
        el("td", { class: "r" + lagClass }, lagText),
        withAge ? el("td", { class: "r" + (st === "stalled" ? " bad" : "") }, age) : null,
        el("td", { style: "width: " + (withAge ? 16 : 35) + "%" }, bar)));
    }
    if (topics.size === 1) body.append(el("div", { class: "note", style: "margin: 0 0 6px" }, "topic " + rows[0].topic));
    body.append(el("div", { class: "table-wrap" }, table));
    const unknownRows = rows.filter((r) => rowState(r) === "unknown");
    if (unknownRows.length) {
      body.append(el("div", { class: "note bad" },
        fmtCount(unknownRows.length) + " partition" + (unknownRows.length === 1 ? "" : "s") +
        " without a figure (" + (unknownRows[0].reason || "unknown") + "): not counted as caught up"));
    }
  }

  // Verifier (pipeline/verify/judge.py Verification.to_json): {status: clean|stale|unverifiable, checked,
  // stale, in_flight, nines (null below min_checked_for_nines), nines_text, unverifiable: [{namespace,
  // reason}], unverifiable_keys, window_ms, ts_ms, reports: [{namespace, tier, rows, checked, stale, ...}]}.
  function renderVerify() {
    const badge = $("verify-state");
    const body = $("verify-body");
    body.innerHTML = "";
    const v = state.verify;
    if (!v) {
      badge.className = "badge badge-neutral";
      badge.textContent = "none";
      body.append(el("div", { class: "muted" }, "no verification yet"),
        el("div", { class: "note" }, "Run freshkey verify to compare every tier with the database."));
      exposed.verify = "no verification yet";
      return;
    }
    const reports = Array.isArray(v.reports) ? v.reports : [v];
    const stale = v.stale != null ? v.stale : reports.reduce((a, r) => a + (r.stale || 0), 0);
    const checked = v.checked != null ? v.checked : reports.reduce((a, r) => a + (r.checked || 0), 0);
    const unverifiable = Array.isArray(v.unverifiable) ? v.unverifiable : [];
    const unverifiableKeys = v.unverifiable_keys || 0;
    const notJudged = unverifiable.length + unverifiableKeys;
    if (stale) {
      badge.className = "badge badge-bad";
      badge.textContent = fmtCount(stale) + " stale";
    } else if (v.status === "unverifiable" || notJudged) {
      badge.className = "badge badge-warn";
      badge.textContent = fmtCount(notJudged) + " unverifiable";
    } else {
      badge.className = "badge badge-ok";
      badge.textContent = "consistent";
    }
    exposed.verify = badge.textContent;
    // nines only from enough entries; below that the worker says why (nines_text), never "0.00 nines".
    const nines = v.nines != null ? fmtCount(v.nines) + " nines" : v.nines_text || (stale ? "stale entries" : "consistent");
    const tone = stale ? "bad" : notJudged ? "warn" : "ok";
    const headline = el("div", { class: (v.nines != null ? "big " : "mid ") + tone }, nines);
    const sub = [fmtCount(checked) + " entries checked", fmtCount(stale) + " stale"];
    if (v.window_ms != null) sub.push("within " + fmtMs(v.window_ms));
    if (v.in_flight) sub.push(fmtCount(v.in_flight) + " in flight");
    if (v.ts_ms) sub.push(ago(v.ts_ms));
    body.append(headline, el("div", { class: "note", style: "margin: 2px 0 10px" }, sub.join(" · ")));
    if (notJudged) {
      const reasons = el("ul", { class: "examples", id: "verify-unverifiable" });
      for (const u of unverifiable) reasons.append(el("li", { class: "warn" }, (u.namespace || "?") + ": " + (u.reason || "unverifiable")));
      if (unverifiableKeys) {
        reasons.append(el("li", { class: "warn" }, fmtCount(unverifiableKeys) + " entr" + (unverifiableKeys === 1 ? "y" : "ies") +
          " could not be judged (key or version unreadable; see the examples)"));
      }
      body.append(el("div", { class: "note warn" }, "not verified:"), reasons);
    }
    const table = el("table", { class: "data" });
    table.append(el("tr", {}, el("th", {}, "namespace · tier"), el("th", { class: "r" }, "rows"),
      el("th", { class: "r" }, "checked"), el("th", { class: "r" }, "stale"), el("th", { class: "r" }, "missing")));
    for (const r of reports) {
      table.append(el("tr", {},
        el("td", {}, (r.namespace || "?") + (r.tier ? " · " + r.tier : "")),
        el("td", { class: "r" }, fmtCount(r.rows)),
        el("td", { class: "r" }, fmtCount(r.checked)),
        el("td", { class: "r" + (r.stale ? " bad" : "") }, fmtCount(r.stale || 0)),
        el("td", { class: "r" + (r.missing ? " warn" : "") }, fmtCount(r.missing || 0))));
    }
    body.append(el("div", { class: "table-wrap" }, table));
    const examples = reports.flatMap((r) => (Array.isArray(r.examples) ? r.examples : [])).slice(0, 4);
    if (examples.length) {
      const ul = el("ul", { class: "examples" });
      for (const e of examples) ul.append(el("li", {}, String(e)));
      body.append(ul);
    }
  }

  function renderTiles() {
    const s = state.summary || {};
    const windowS = lagWindowS();
    const figures = state.windows["last_" + windowS + "s"] || {};
    const lag = figures.lag_ms || {};
    const target = slaTargetMs();
    tileMs($("t-p50"), lag.p50, target);
    tileMs($("t-p99"), lag.p99, target);
    tileMs($("t-max"), lag.max, target);
    const caption = fmtWindow(windowS) + (figures.end ? " to " + clock(figures.end) : "");
    for (const cap of document.querySelectorAll(".lag-window")) cap.textContent = caption;
    exposed.tiles = { window_s: windowS, end: figures.end == null ? null : figures.end, p50: lag.p50, p99: lag.p99, max: lag.max };
    $("t-p99").className = "tile-value" + (target != null && lag.p99 != null ? (lag.p99 > target ? " bad" : " ok") : "");
    $("t-rate").textContent = s.changes_per_s == null ? "–" : fmtCount(s.changes_per_s);
    $("t-rate-window").textContent = fmtWindow(s.window_s == null ? DEFAULT_WINDOW_S : s.window_s);
    const totals = { applied: 0, tombstoned: 0, not_newer: 0 };
    const outcomes = (state.stats && state.stats.outcomes) || {};
    for (const [key, n] of Object.entries(outcomes)) {
      const outcome = key.slice(key.lastIndexOf(":") + 1);
      if (outcome in totals) totals[outcome] += n;
    }
    $("t-applied").textContent = state.stats ? fmtCount(totals.applied) : "–";
    $("t-tombstoned").textContent = state.stats ? fmtCount(totals.tombstoned) : "–";
    $("t-not-newer").textContent = state.stats ? fmtCount(totals.not_newer) : "–";
    const dead = state.stats && state.stats.events ? state.stats.events.dead_lettered || 0 : null;
    $("t-dead").textContent = dead == null ? "–" : fmtCount(dead);
    $("t-dead").className = "tile-value" + (dead > 0 ? " bad" : "");
    if (state.stats) {
      const up = state.stats.uptime_s;
      const h = Math.floor(up / 3600), m = Math.floor((up % 3600) / 60), sec = Math.floor(up % 60);
      $("footer-text").textContent = "freshkey worker · up " + (h ? h + "h " : "") + m + "m " + sec + "s";
    }
  }

  function render() {
    if (state.now == null) return;
    const xs = timeline();
    renderTiles();
    renderLag(xs);
    renderStages(xs);
    renderOutcomes(xs);
    renderSla();
    renderConsumer();
    renderVerify();
  }

  // ---------------------------------------------------------------------------------------------------
  // controls

  function activate(group, attr, value) {
    for (const b of group.querySelectorAll("button")) b.classList.toggle("active", b.getAttribute(attr) === String(value));
  }

  const windowGroup = $("window");
  activate(windowGroup, "data-window", state.windowS);
  windowGroup.addEventListener("click", (e) => {
    const w = e.target.getAttribute && e.target.getAttribute("data-window");
    if (!w) return;
    state.windowS = Number(w);
    save("window", w);
    activate(windowGroup, "data-window", w);
    render();
  });
  for (const group of document.querySelectorAll("[data-scale-for]")) {
    const name = group.getAttribute("data-scale-for");
    activate(group, "data-scale", state.scales[name]);
    group.addEventListener("click", (e) => {
      const s = e.target.getAttribute && e.target.getAttribute("data-scale");
      if (!s) return;
      state.scales[name] = s;
      save("scale." + name, s);
      activate(group, "data-scale", s);
      render();
    });
  }

  tick();
})();
