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
    const form = ev.target.form;
    if (form && form.hasAttribute("data-autosubmit")) form.submit();
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

  function plot(target, title, x, series, labels, points, time) {
    const wrap = document.createElement("div");
    wrap.className = "chart";
    wrap.dataset.metric = title;
    wrap.dataset.points = String(points);
    wrap.dataset.plotted = String(series.reduce((n, s) => n + s.filter((v) => v !== null).length, 0));
    const h = document.createElement("h3");
    h.textContent = title;
    wrap.appendChild(h);
    target.appendChild(wrap);
    const log = !time && logScale();
    const ys = log ? series.map((s) => s.map((v) => (v !== null && v > 0 ? v : null))) : series;
    const opts = {
      width: Math.max(320, Math.min(target.clientWidth || 900, 1100)), height: 240,
      scales: {x: {time: !!time}, y: log ? {distr: 3, log: 10} : {}},
      series: [{label: time ? "time" : "step"}].concat(labels.map((l, i) => ({label: l, stroke: COLORS[i % COLORS.length], width: 1.5,
                                                                points: {show: x.length < 60}}))),
      axes: [{label: time ? "time" : "step"}, {}],
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
            for (const c of charts) plot(root, c.title, c.x, c.series, c.labels, c.points, true);
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
