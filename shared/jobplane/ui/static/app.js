// jobplane dashboard: the log follower, the metric and system charts (uPlot) and the cancel confirmation. No inline
// scripts (the pages' Content-Security-Policy forbids them); all text from jobs goes in as text, never as HTML.
"use strict";
(function () {
  const COLORS = ["#2f6fed", "#f79009", "#12b76a", "#d92d20", "#7a5af8", "#0ba5ec", "#ee46bc", "#667085"];
  const MAX_LINES = 5000; // the log keeps its last lines in the page, never a whole 100k-line output

  document.addEventListener("submit", (ev) => {
    const form = ev.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) ev.preventDefault();
  });
  document.addEventListener("change", (ev) => {
    const form = ev.target.form;  // a form, or one field of it, that applies on change
    if (form && (form.hasAttribute("data-autosubmit") || ev.target.hasAttribute("data-autosubmit"))) form.submit();
  });

  // ---- logs --------------------------------------------------------------------------------------------
  function followLog(pre) {
    const job = pre.dataset.job;
    const pick = document.getElementById("logpick");
    const state = document.getElementById("log-state");
    let cursor = null, timer = null, generation = 0, lines = 0, after = 3, chosen = false;

    function reset() {
      generation += 1; cursor = null; lines = 0; after = 3;
      pre.textContent = "";
      clearTimeout(timer);
      poll();
    }
    function append(text) {
      if (!text) return;
      const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 40;
      pre.appendChild(document.createTextNode(text));
      lines += (text.match(/\n/g) || []).length;
      if (lines > MAX_LINES) {
        const all = pre.textContent.split("\n");
        pre.textContent = all.slice(all.length - MAX_LINES - 1).join("\n");
        lines = MAX_LINES;
      }
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }
    async function poll() {
      const mine = generation;
      const q = new URLSearchParams({attempt: pick.attempt.value, rank: pick.rank.value});
      if (cursor !== null) q.set("cursor", cursor);
      try {
        const r = await fetch(`/jobs/${encodeURIComponent(job)}/logs?${q}`);
        if (r.ok && mine === generation) {
          const body = await r.json();
          if (body.refused) { state.textContent = body.refused; after = 0; return; }
          if (cursor === null && body.skipped) append(`[${body.skipped} earlier chunks left out: jobplane logs ${job} prints them all]\n`);
          append(body.text);
          cursor = body.cursor;
          if (!body.live) after -= 1;
          state.textContent = body.live ? "following" : (after > 0 ? "job ended; reading its last output" : "job ended");
          pre.dataset.cursor = String(cursor);
        }
      } catch (e) { state.textContent = "the dashboard is unreachable; retrying"; }
      if (mine === generation && after > 0) timer = setTimeout(poll, 1500);
    }
    pick.addEventListener("change", () => { chosen = true; reset(); });
    document.body.addEventListener("htmx:afterSwap", () => {
      const status = document.getElementById("status");
      const current = status ? parseInt(status.dataset.attempt || "0", 10) : 0;
      const select = pick.attempt;
      let added = false;
      for (let n = select.options.length + 1; n <= current; n++) { select.add(new Option(String(n), String(n))); added = true; }
      if (added && !chosen) { select.value = String(current); reset(); }
    });
    poll();
  }

  // ---- charts ------------------------------------------------------------------------------------------
  function logScale() { const box = document.getElementById("logscale"); return !!(box && box.checked); }

  // A step (or a point's index) is a whole number: its axis ticks only at whole numbers, never at 2.5.
  const WHOLE = [];
  for (let e = 0; e <= 12; e++) for (const m of [1, 2, 5]) WHOLE.push(m * 10 ** e);

  // A tick's text, its decimals from the step between ticks (so 0.0002 apart reads 0.0002, 0.0004, not 0, 0),
  // on a log scale from the tick itself.
  function tickText(v, incr, log) {
    if (v === null || v === undefined) return "";
    if (log) return String(+v.toPrecision(3));
    const decimals = incr >= 1 || !incr ? 0 : Math.min(8, Math.ceil(-Math.log10(incr) - 1e-9));
    return v.toFixed(decimals);
  }

  function plot(target, title, x, series, labels, points, time, attempts) {
    const wrap = document.createElement("div");
    wrap.className = "chart";
    wrap.dataset.metric = title;
    wrap.dataset.points = String(points);
    wrap.dataset.plotted = String(series.reduce((n, s) => n + s.filter((v) => v !== null).length, 0));
    wrap.dataset.lines = String(series.length);
    const h = document.createElement("h3");
    h.textContent = title;
    wrap.appendChild(h);
    target.appendChild(wrap);
    const log = !time && logScale();
    const ys = log ? series.map((s) => s.map((v) => (v !== null && v > 0 ? v : null))) : series;
    // a line's colour is its rank's (and GPU's), the same in every attempt; a later attempt's line is dashed
    const base = labels.map((l) => l.split(" · attempt ")[0]);
    const bases = [...new Set(base)];
    const first = attempts && attempts.length ? Math.min(...attempts) : 1;
    function ticks(key) {  // the texts an axis drew, kept on the chart for whoever reads the page's DOM
      return (u, splits, i, space, incr) => {
        const texts = splits.map((v) => tickText(v, incr, key === "y" && log));
        wrap.dataset[key + "ticks"] = texts.join("|");
        return texts;
      };
    }
    const opts = {
      width: Math.max(320, Math.min(target.clientWidth || 900, 1100)), height: 240,
      scales: {x: {time: !!time}, y: log ? {distr: 3, log: 10} : {}},
      series: [{label: time ? "time" : "step"}].concat(labels.map((l, i) => ({
        label: l, stroke: COLORS[bases.indexOf(base[i]) % COLORS.length], width: 1.5,
        dash: attempts && attempts[i] !== first ? [6, 4] : undefined,
        spanGaps: !!time,  // a line per attempt: its gaps are other ranks' sample times, not a silence
        points: {show: x.length < 60}}))),
      axes: [time ? {label: "time"} : {label: "step", incrs: WHOLE, values: ticks("x")}, {values: ticks("y")}],
      legend: {live: true},
    };
    return new uPlot(opts, [x].concat(ys), wrap);
  }

  function stillLive() { const s = document.getElementById("status"); return !!(s && s.hasAttribute("hx-get")); }

  function metricsPanel(root) {
    const job = root.dataset.job;
    let last = "", body = {}, after = 2;
    function draw() {
      const names = Object.keys(body);
      if (!names.length) return;
      root.textContent = "";
      for (const name of names) {
        const m = body[name];
        plot(root, name, m.x, m.series, m.attempts.map((a) => `attempt ${a}`), m.points);
      }
    }
    async function load() {
      try {
        const r = await fetch(`/jobs/${encodeURIComponent(job)}/metrics.json`);
        if (r.status === 403) { root.textContent = (await r.json()).refused; return; }  // another team's job
        if (r.ok) {
          const text = await r.text();
          if (text !== last) { last = text; body = JSON.parse(text); draw(); }
        }
      } catch (e) { /* the next poll tries again */ }
      if (!stillLive()) after -= 1;
      if (after > 0) setTimeout(load, 3000);
    }
    const box = document.getElementById("logscale");
    if (box) box.addEventListener("change", draw);
    load();
  }

  function systemPanel(root) {
    const job = root.dataset.job;
    let last = "", after = 2;
    async function load() {
      try {
        const r = await fetch(`/jobs/${encodeURIComponent(job)}/system.json`);
        if (r.status === 403) { root.textContent = (await r.json()).refused; return; }  // another team's job
        if (r.ok) {
          const text = await r.text();
          const charts = JSON.parse(text);
          if (text !== last && charts.length) {
            last = text;
            root.textContent = "";
            for (const c of charts) plot(root, c.title, c.x, c.series, c.labels, c.points, true, c.attempts);
          }
        }
      } catch (e) { /* the next poll tries again */ }
      if (!stillLive()) after -= 1;
      if (after > 0) setTimeout(load, 15000);
    }
    load();
  }

  function comparePanel(root) {
    const source = document.getElementById("compare-data");
    const body = JSON.parse(source.textContent);
    function draw() {
      root.textContent = "";
      if (body.x.length) plot(root, root.dataset.metric, body.x, body.series, body.jobs,
                              body.series.reduce((n, s) => n + s.filter((v) => v !== null).length, 0));
    }
    const box = document.getElementById("logscale");
    if (box) box.addEventListener("change", draw);
    draw();
  }

  document.addEventListener("DOMContentLoaded", () => {
    const pre = document.getElementById("log");
    if (pre) followLog(pre);
    const metrics = document.getElementById("metrics");
    if (metrics) metricsPanel(metrics);
    const system = document.getElementById("system");
    if (system) systemPanel(system);
    const compare = document.getElementById("compare");
    if (compare) comparePanel(compare);
  });
})();
