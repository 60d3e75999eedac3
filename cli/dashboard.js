// tuner dashboard: polls the JSON endpoints of `tuner dashboard` (cli/dashboard.py) and draws
// the chosen study with Plotly. Read-only; it never sends anything but GET.
"use strict";

const state = {
  pollMs: 2000,
  studies: [],
  name: null,
  study: null,
  etags: {},
  sort: { key: "id", dir: 1 },
  importance: null, // {key, body} or {key, error}
  importanceKey: null,
  importanceBusy: false,
  rendered: false,
};

const PLOT_CONFIG = { displaylogo: false, responsive: true };
const COLORS = { ok: "#1f77b4", bad: "#ff7f0e", broken: "#d62728", best: "#2ca02c",
                 control: "#7f7f7f", default: "#7f7f7f" };

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function fmt(v) {
  if (v === null || v === undefined) return "-";
  if (typeof v === "number") {
    if (Number.isInteger(v)) return String(v);
    const a = Math.abs(v);
    return a !== 0 && (a >= 1e5 || a < 1e-3) ? v.toExponential(3) : String(+v.toPrecision(4));
  }
  return String(v);
}

function ago(epoch) {
  if (!epoch) return "";
  const s = Math.max(0, Date.now() / 1000 - epoch);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-cache", credentials: "same-origin" });
  let body = null;
  try { body = await response.json(); } catch (e) { body = { error: response.statusText }; }
  if (!response.ok) {
    const error = new Error(body.error || response.statusText);
    error.status = response.status;
    throw error;
  }
  return { etag: response.headers.get("ETag"), body };
}

// -- polling ---------------------------------------------------------------------------------
async function poll() {
  try {
    const studies = await getJSON("/api/studies");
    let listed = studies.etag !== state.etags.studies; // the list to draw again
    if (listed) {
      state.etags.studies = studies.etag;
      state.studies = studies.body.studies;
      state.pollMs = studies.body.poll_ms || state.pollMs;
      $("source").textContent = studies.body.source;
    }
    const wanted = readHash();
    const name = state.studies.some((s) => s.name === wanted) ? wanted
      : (state.name || (state.studies[0] && state.studies[0].name) || null);
    if (name !== state.name) {
      state.name = name;
      state.etags.study = null;
      state.importance = null;
      state.importanceKey = null;
      listed = true;
    }
    if (listed) renderStudies();
    if (state.name) {
      const study = await getJSON("/api/study?name=" + encodeURIComponent(state.name));
      if (study.etag !== state.etags.study) {
        state.etags.study = study.etag;
        state.study = study.body;
        renderStudy();
      }
      refreshImportance(); // a GP fit takes seconds: the polls go on meanwhile
    } else {
      $("empty").classList.remove("hidden");
      $("study").classList.add("hidden");
    }
    setLive(true);
  } catch (error) {
    setLive(false, error.message);
  }
  if (!state.rendered) {
    state.rendered = true;
    document.body.dataset.ready = "true"; // the first full drawing is done (for tests)
  }
  document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  setTimeout(poll, state.pollMs);
}

function setLive(ok, message) {
  const study = state.study;
  const live = $("live");
  live.replaceChildren(el("span", { class: ok ? "dot on" : "dot off" }));
  if (!ok) {
    live.append(`not reachable: ${message}`);
  } else if (study) {
    const running = study.running ? `running: ${study.running} trial(s) out` : "no trial out";
    live.append(`${running} · last change ${ago(study.updated)}`);
  } else {
    live.append("connected");
  }
}

// The address keeps what is shown, to share or reload: #study=NAME&sort=COLUMN&dir=desc
function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  const key = params.get("sort");
  if (key) state.sort = { key, dir: params.get("dir") === "desc" ? -1 : 1 };
  return params.get("study");
}

function writeHash() {
  const params = new URLSearchParams();
  if (state.name) params.set("study", state.name);
  if (state.sort.key !== "id" || state.sort.dir !== 1) {
    params.set("sort", state.sort.key);
    params.set("dir", state.sort.dir > 0 ? "asc" : "desc");
  }
  history.replaceState(null, "", "#" + params.toString());
}

window.addEventListener("hashchange", () => { setTimeout(poll, 0); });

// -- the study list --------------------------------------------------------------------------
function renderStudies() {
  const list = $("study-list");
  list.replaceChildren(...state.studies.map((s) => {
    const goals = s.objectives.map((o) => `${o.goal} ${o.name}`).join(", ");
    const active = (s.counts.ACTIVE || 0) + (s.counts.PENDING || 0);
    const link = el("a", { href: "#" + new URLSearchParams({ study: s.name }).toString(),
                           class: s.name === state.name ? "current" : "" },
      el("strong", { text: s.name }),
      el("small", { text: goals }),
      el("small", { text: `${s.trials} trials, ${s.knobs} knobs` +
                           (active ? ` · ${active} running` : "") }));
    return el("li", {}, link);
  }));
  $("empty").classList.toggle("hidden", state.studies.length > 0);
}

// -- one study -------------------------------------------------------------------------------
function objective(study) { return study.objectives[0]; }

function trialById(study, id) { return study.trials.find((t) => t.id === id) || null; }

function renderStudy() {
  const study = state.study;
  $("study").classList.remove("hidden");
  $("empty").classList.add("hidden");
  const goals = study.objectives.map((o) => `${o.goal} ${o.name}`).join(", ");
  const under = study.constraints.length ? ` subject to ${study.constraints.join(", ")}` : "";
  $("title").textContent = `${study.name}: ${goals}${under}`;
  renderSummary(study);
  const multi = study.objectives.length > 1;
  $("convergence-box").classList.toggle("hidden", multi);
  $("front-box").classList.toggle("hidden", !multi);
  if (multi) drawFront(study); else drawConvergence(study);
  drawParallel(study);
  drawSlices(study);
  renderTable();
}

function card(title, big, ...lines) {
  return el("div", { class: "card" }, el("h3", { text: title }),
            el("div", { class: "big", text: big }),
            ...lines.filter((l) => l).map((l) => el("p", { text: l })));
}

function renderSummary(study) {
  const c = study.counts;
  const total = study.trials.length;
  const statuses = Object.entries(c).map(([k, v]) => `${v} ${k}`).join(", ");
  const cards = [card("Trials", String(total), statuses,
                      study.running ? `running: ${study.running} handed out` : "no trial out")];
  const name = objective(study).name;
  const def = trialById(study, study.default);
  cards.push(card("Default", def ? fmt(def.metrics[name]) : "not measured",
                  def ? `trial ${def.id}, ${name}` : "", def && def.feasible === false
                    ? "breaks a constraint" : ""));
  if (study.objectives.length > 1) {
    cards.push(card("Pareto front", `${study.front.length} trials`,
                    `trials ${study.front.join(", ") || "-"}`));
  } else {
    const best = trialById(study, study.best);
    const v = study.verdict;
    const how = v ? (v.confirmed ? "confirmed" : `by ${v.basis}, unconfirmed`) : "";
    cards.push(card("Best", best ? fmt(best.metrics[name]) : "none yet",
                    best ? `trial ${best.id} (${best.step}, ${how}), ${name} as measured` : "",
                    study.ratio ? `${study.ratio.toFixed(2)}x the default (session measurement)`
                      : "", v ? v.text : ""));
  }
  cards.push(confirmationCard(study));
  if (study.learned_from) {
    cards.push(card("Transfer", "earlier studies", study.learned_from));
  }
  $("summary").replaceChildren(...cards);
}

function confirmationCard(study) {
  const c = study.confirmation;
  if (!c && study.objectives.length > 1) {
    return card("Confirmation", "none", "a study with several objectives has a Pareto front, " +
                "not one best to confirm against the default");
  }
  if (!c) {
    return card("Confirmation", "not yet",
                "a tune session confirms its best against the default at its end, in " +
                "interleaved rounds");
  }
  if (c.best_trial === null) {
    return card("Confirmation", "none feasible",
                "no candidate was feasible and stable in every round");
  }
  const i = c.interval;
  if (!i) return card("Confirmation", `trial ${c.best_trial}`, `${c.rounds} rounds`);
  const verdict = c.significant ? "confirmed" : "not beyond noise";
  const level = Math.round(i.level * 100);
  const value = c.value ? `best ${fmt(c.value.mean)} (${fmt(c.value.low)}–${fmt(c.value.high)})`
    : "";
  // a confidence sequence after few rounds may have no upper bound yet (the API's null),
  // said as `tuner best` says it
  const range = i.high === null ? `no bound yet after ${i.pairs} rounds`
    : `${i.low.toFixed(2)}–${i.high.toFixed(2)}`;
  return card("Confirmation", `${i.ratio.toFixed(2)}x (${range})`,
              `${verdict}: trial ${c.best_trial} against the default, ${level} % interval`,
              `${c.rounds} interleaved rounds each`, value);
}

// -- charts ----------------------------------------------------------------------------------
function baseLayout(extra) {
  return Object.assign({ margin: { l: 60, r: 20, t: 28, b: 80 }, height: 360,
                         legend: { orientation: "h", y: -0.3, font: { size: 11 } },
                         paper_bgcolor: "#fff", plot_bgcolor: "#fff",
                         xaxis: { gridcolor: "#eee" }, yaxis: { gridcolor: "#eee" } }, extra);
}

function drawConvergence(study) {
  const name = objective(study).name;
  const done = study.trials.filter((t) => t.status === "COMPLETED" && t.metrics[name] !== undefined
                                          && t.metrics[name] !== null);
  const ok = done.filter((t) => t.feasible);
  const bad = done.filter((t) => !t.feasible);
  const broken = study.trials.filter((t) => t.status === "INFEASIBLE" || t.status === "TIMED_OUT");
  const spread = (ts) => ({ type: "data", array: ts.map((t) => (t.spread || {})[name] || 0),
                            visible: true, color: "rgba(31,119,180,0.45)", thickness: 1 });
  const traces = [
    { x: ok.map((t) => t.id), y: ok.map((t) => t.metrics[name]), mode: "markers", type: "scatter",
      name: "feasible trial", marker: { color: COLORS.ok, size: 8 }, error_y: spread(ok),
      text: ok.map((t) => `trial ${t.id} (${t.step})`) },
    { x: bad.map((t) => t.id), y: bad.map((t) => t.metrics[name]), mode: "markers",
      type: "scatter", name: "violates a constraint",
      marker: { color: COLORS.bad, symbol: "x", size: 9 },
      text: bad.map((t) => `trial ${t.id} (${t.step})`) },
  ];
  const curve = study.trials.filter((t) => t.best_so_far !== null);
  if (curve.length) {
    traces.push({ x: curve.map((t) => t.id), y: curve.map((t) => t.best_so_far), mode: "lines",
                  type: "scatter", name: "best feasible so far",
                  line: { color: COLORS.best, width: 3, shape: "hv" } });
  }
  const controls = study.controls.filter((c) => c.metrics[name] !== undefined);
  if (controls.length) {
    traces.push({ x: controls.map((c) => c.after + 0.5), y: controls.map((c) => c.metrics[name]),
                  mode: "markers", type: "scatter", name: "default re-measured",
                  marker: { color: COLORS.control, symbol: "diamond", size: 7 } });
  }
  const c = study.confirmation;
  if (c && c.value) {
    const x = Math.max(...study.trials.map((t) => t.id)) + 2;
    traces.push({ x: [x], y: [c.value.mean], mode: "markers", type: "scatter",
                  name: `trial ${c.best_trial} confirmed (${Math.round(c.interval.level * 100)} % CI)`,
                  marker: { color: COLORS.best, symbol: "diamond", size: 11 },
                  // an end with no bound yet (null) gets no bar on its side
                  error_y: { type: "data", symmetric: false,
                             array: [c.value.high === null ? 0 : c.value.high - c.value.mean],
                             arrayminus: [c.value.low === null ? 0 : c.value.mean - c.value.low],
                             color: COLORS.best } });
  }
  const shapes = [];
  const def = trialById(study, study.default);
  if (def && def.metrics[name] !== undefined) {
    shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: def.metrics[name],
                  y1: def.metrics[name], line: { color: COLORS.default, dash: "dash", width: 1 } });
    traces.push({ x: [null], y: [null], mode: "lines", type: "scatter", name: "default",
                  line: { color: COLORS.default, dash: "dash", width: 1 } });
  }
  if (broken.length) {
    traces.push({ x: broken.map((t) => t.id), y: broken.map(() => 0), yaxis: "y2",
                  mode: "markers", type: "scatter", name: "config broke the system",
                  marker: { color: COLORS.broken, symbol: "triangle-down", size: 9 },
                  text: broken.map((t) => t.reason), cliponaxis: false });
  }
  $("convergence-note").textContent =
    `${objective(study).goal} ${name}; ${done.length} measured, ${broken.length} broke the system`;
  Plotly.react("convergence", traces, baseLayout({
    shapes, xaxis: { title: { text: "trial" }, gridcolor: "#eee" },
    yaxis: { title: { text: name }, gridcolor: "#eee" },
    yaxis2: { overlaying: "y", range: [0, 1], visible: false, fixedrange: true } }), PLOT_CONFIG);
}

function drawFront(study) {
  const [a, b] = study.objectives;
  if (!b) return;
  const done = study.trials.filter((t) => t.status === "COMPLETED" && t.metrics[a.name] != null
                                          && t.metrics[b.name] != null);
  const onFront = new Set(study.front);
  const rest = done.filter((t) => !onFront.has(t.id));
  const front = done.filter((t) => onFront.has(t.id))
    .sort((p, q) => p.metrics[a.name] - q.metrics[a.name]);
  const traces = [
    { x: rest.map((t) => t.metrics[a.name]), y: rest.map((t) => t.metrics[b.name]),
      mode: "markers", type: "scatter", name: "trial",
      marker: { color: rest.map((t) => (t.feasible ? t.id : null)), colorscale: "Blues",
                size: 7, line: { width: 0 } },
      text: rest.map((t) => `trial ${t.id}${t.feasible ? "" : " (violates a constraint)"}`) },
    { x: front.map((t) => t.metrics[a.name]), y: front.map((t) => t.metrics[b.name]),
      mode: "lines+markers", type: "scatter", name: "Pareto front",
      line: { color: COLORS.best, shape: "hv" }, marker: { color: COLORS.best, size: 10 },
      text: front.map((t) => `trial ${t.id}`) },
  ];
  const def = trialById(study, study.default);
  if (def && def.metrics[a.name] != null) {
    traces.push({ x: [def.metrics[a.name]], y: [def.metrics[b.name]], mode: "markers",
                  type: "scatter", name: "default",
                  marker: { color: "#000", symbol: "star", size: 13 } });
  }
  $("front-note").textContent = `${a.goal} ${a.name}, ${b.goal} ${b.name}: ${front.length} ` +
    `trials on the front of ${done.length} measured`;
  Plotly.react("front", traces, baseLayout({
    xaxis: { title: { text: a.name }, gridcolor: "#eee" },
    yaxis: { title: { text: b.name }, gridcolor: "#eee" } }), PLOT_CONFIG);
}

const MAX_AXES = 12;

// The knobs that take more than one value among ``done``: in the study's order, and in the
// order of the GP's importance once that is in (``ranked``).
function varyingKnobs(study, done) {
  const varying = study.knobs.filter((k) => new Set(done.map((t) => JSON.stringify(
    t.config[k.name]))).size > 1);
  const ranked = state.importance && state.importance.body
    ? state.importance.body.knobs.map((k) => k.knob) : [];
  const order = (k) => { const i = ranked.indexOf(k.name); return i < 0 ? 1e9 : i; };
  const byImportance = ranked.length ? [...varying].sort((p, q) => order(p) - order(q))
    : varying;
  return { varying, byImportance, ranked: ranked.length > 0 };
}

function parallelKnobs(study, done) {
  const { varying, byImportance, ranked } = varyingKnobs(study, done);
  let chosen = varying;
  let why = "";
  if (varying.length > MAX_AXES) {
    chosen = byImportance.slice(0, MAX_AXES);
    why = ranked ? ", the most important" : ", the first in the study";
  }
  const note = `${chosen.length} of ${study.knobs.length} knobs (those that vary${why}) and ` +
    `the metrics; colour: ${objective(study).name}`;
  return { chosen, note };
}

function axis(knob, values) {
  if (knob.choices) {
    const keys = knob.choices.map((c) => JSON.stringify(c));
    return { label: knob.name, range: [0, Math.max(1, keys.length - 1)],
             tickvals: keys.map((_, i) => i), ticktext: knob.choices.map(String),
             values: values.map((v) => keys.indexOf(JSON.stringify(v))) };
  }
  if (knob.log) {
    const lo = Math.log10(knob.low);
    const hi = Math.log10(knob.high);
    const ticks = [];
    for (let p = Math.ceil(lo); p <= Math.floor(hi); p += 1) ticks.push(p);
    return { label: `${knob.name} (log)`, range: [lo, hi], tickvals: ticks,
             ticktext: ticks.map((p) => fmt(10 ** p)), values: values.map((v) => Math.log10(v)) };
  }
  return { label: knob.unit ? `${knob.name} (${knob.unit})` : knob.name,
           range: [knob.low, knob.high], values };
}

function drawParallel(study) {
  const name = objective(study).name;
  const done = study.trials.filter((t) => t.status === "COMPLETED" && t.metrics[name] != null);
  if (done.length < 2) {
    $("parallel-note").textContent = "(from two completed trials on)";
    Plotly.purge("parallel");
    return;
  }
  const { chosen, note } = parallelKnobs(study, done);
  const dims = chosen.map((k) => axis(k, done.map((t) => t.config[k.name])));
  for (const m of study.metrics) {
    const vals = done.map((t) => (t.metrics[m] == null ? NaN : t.metrics[m]));
    dims.push({ label: m, values: vals });
  }
  if (study.constraints.length) {
    dims.push({ label: "feasible", range: [0, 1], tickvals: [0, 1], ticktext: ["no", "yes"],
                values: done.map((t) => (t.feasible ? 1 : 0)) });
  }
  $("parallel-note").textContent = note;
  const colors = done.map((t) => t.metrics[name]);
  Plotly.react("parallel", [{
    type: "parcoords", dimensions: dims,
    line: { color: colors, colorscale: "Viridis", showscale: true,
            reversescale: objective(study).goal === "minimize",
            colorbar: { title: { text: name }, thickness: 12 } },
  }], baseLayout({ margin: { l: 70, r: 70, t: 50, b: 30 } }), PLOT_CONFIG);
}

// The objective against each knob that varies, a small plot per knob (optuna-dashboard's
// slice plot): where in a knob's range the good trials lie. The most important knobs first
// once the GP's importance is in; at most MAX_SLICES of them.
const MAX_SLICES = 8;

function drawSlices(study) {
  const name = objective(study).name;
  const done = study.trials.filter((t) => t.status === "COMPLETED" && t.metrics[name] != null);
  const { varying: all, byImportance, ranked } = varyingKnobs(study, done);
  const knobs = byImportance.slice(0, MAX_SLICES);
  const varying = all.length;
  if (done.length < 2 || !knobs.length) {
    $("slices-note").textContent = "(from two completed trials that differ)";
    Plotly.purge("slices");
    return;
  }
  const columns = Math.min(4, knobs.length);
  const rows = Math.ceil(knobs.length / columns);
  const ok = done.filter((t) => t.feasible);
  const bad = done.filter((t) => !t.feasible);
  const def = trialById(study, study.default);
  const best = trialById(study, study.best);
  const layout = baseLayout({
    grid: { rows, columns, pattern: "independent", xgap: 0.1, ygap: 0.45 },
    height: 200 * rows + 110, margin: { l: 60, r: 20, t: 40, b: 50 },
    legend: { orientation: "h", x: 0, y: 1, yanchor: "bottom", font: { size: 11 } } });
  const traces = [];
  knobs.forEach((k, i) => {
    const n = i === 0 ? "" : String(i + 1);
    const x = (t) => (k.choices ? String(t.config[k.name]) : t.config[k.name]);
    const group = (ts, label, marker) => ({
      x: ts.map(x), y: ts.map((t) => t.metrics[name]), xaxis: "x" + n, yaxis: "y" + n,
      mode: "markers", type: "scatter", name: label, legendgroup: label, showlegend: i === 0,
      marker, text: ts.map((t) => `trial ${t.id} (${t.step})`) });
    traces.push(group(ok, "feasible trial", { color: COLORS.ok, size: 7, opacity: 0.8 }));
    traces.push(group(bad, "violates a constraint",
                      { color: COLORS.bad, symbol: "x", size: 8 }));
    if (def && def.metrics[name] != null) {
      traces.push(group([def], "default", { color: "#000", symbol: "star", size: 12 }));
    }
    if (best) traces.push(group([best], "best", { color: COLORS.best, symbol: "diamond", size: 11 }));
    const unit = k.unit ? ` (${k.unit})` : "";
    layout["xaxis" + n] = {
      title: { text: k.name + unit, font: { size: 12 } }, gridcolor: "#eee", automargin: true,
      ...(k.choices ? { type: "category", categoryorder: "array",
                        categoryarray: k.choices.map(String) }
        : { type: k.log ? "log" : "linear" }) };
    layout["yaxis" + n] = { gridcolor: "#eee",
                            ...(i % columns === 0 ? { title: { text: name, font: { size: 12 } } }
                              : {}) };
  });
  const which = varying > knobs.length
    ? `${knobs.length} of the ${varying} knobs that vary, ${ranked ? "the most important" : "the first"}`
    : `the ${knobs.length} knobs that vary${ranked ? ", the most important first" : ""}`;
  $("slices-note").textContent = `${name} against ${which}`;
  Plotly.react("slices", traces, layout, PLOT_CONFIG);
}

// -- importance ------------------------------------------------------------------------------
async function refreshImportance() {
  const study = state.study;
  if (!study) return;
  const completed = study.counts.COMPLETED || 0;
  const key = `${study.name}|${completed}|${study.trials.length}`;
  if (key === state.importanceKey || state.importanceBusy) return;
  state.importanceBusy = true;
  if (!state.importance) $("importance-note").textContent = "fitting the study's GP…";
  try {
    const found = await getJSON("/api/importance?name=" + encodeURIComponent(study.name));
    state.importance = { body: found.body };
  } catch (error) {
    state.importance = { error: error.message, status: error.status };
  } finally {
    state.importanceKey = key;
    state.importanceBusy = false;
  }
  drawImportance();
  if (state.study && state.study.trials.length && state.importance.body) {
    drawParallel(state.study);
    drawSlices(state.study);
  }
}

function drawImportance() {
  const found = state.importance;
  const note = $("importance-note");
  if (!found || found.error) {
    note.textContent = found ? found.error : "";
    Plotly.purge("importance");
    return;
  }
  const knobs = found.body.knobs.slice(0, 15).reverse(); // the most important on top
  note.textContent = `${found.body.metric}, from ${found.body.completed} completed trials; ` +
    "total: with interactions; near 0: the knob can stay at its default";
  Plotly.react("importance", [
    { type: "bar", orientation: "h", name: "total", y: knobs.map((k) => k.knob),
      x: knobs.map((k) => k.total), marker: { color: "#1f77b4" },
      error_x: { type: "data", array: knobs.map((k) => k.total_se), visible: true } },
    { type: "bar", orientation: "h", name: "first order (alone)", y: knobs.map((k) => k.knob),
      x: knobs.map((k) => k.first), marker: { color: "#aec7e8" },
      error_x: { type: "data", array: knobs.map((k) => k.first_se), visible: true } },
  ], baseLayout({ barmode: "group", margin: { l: 140, r: 20, t: 28, b: 80 },
                  xaxis: { range: [0, 1.05], title: { text: "share of variance" },
                           gridcolor: "#eee" } }), PLOT_CONFIG);
}

// -- the trial table -------------------------------------------------------------------------
function columns(study) {
  const metric = (m) => ({ key: "m:" + m, label: m, num: true,
                           get: (t) => t.metrics[m],
                           show: (t) => (t.spread && t.spread[m] != null && t.repeats > 1
                             ? `${fmt(t.metrics[m])} ± ${fmt(t.spread[m])}` : fmt(t.metrics[m])) });
  return [
    { key: "id", label: "id", num: true, get: (t) => t.id },
    { key: "status", label: "status", get: (t) => t.status },
    { key: "step", label: "step", get: (t) => t.step },
    { key: "ok", label: "ok", get: (t) => (t.feasible === null ? "" : t.feasible ? "yes" : "no") },
    { key: "n", label: "n", num: true, get: (t) => t.repeats },
    ...study.metrics.map(metric),
    { key: "changed", label: "changed knobs (from the default)", get: (t) => changedText(t) },
  ];
}

function changedText(t) {
  const parts = Object.entries(t.changed).map(([k, v]) => `${k}=${fmt(v)}`);
  const text = parts.length ? parts.join(", ") : "(the default)";
  return t.reason ? `${text} — ${t.reason}` : text;
}

function renderTable() {
  const study = state.study;
  if (!study) return;
  const cols = columns(study);
  const head = el("tr", {}, ...cols.map((c) => {
    const th = el("th", { text: c.label, "data-key": c.key, scope: "col" });
    if (state.sort.key === c.key) {
      th.setAttribute("aria-sort", state.sort.dir > 0 ? "ascending" : "descending");
    }
    th.addEventListener("click", () => {
      state.sort = { key: c.key, dir: state.sort.key === c.key ? -state.sort.dir : 1 };
      writeHash();
      renderTable();
    });
    return th;
  }));
  $("trials").tHead.replaceChildren(head);
  const col = cols.find((c) => c.key === state.sort.key) || cols[0];
  const key = (t) => { const v = col.get(t); return v === null || v === undefined ? null : v; };
  const rows = [...study.trials].sort((p, q) => {
    const a = key(p);
    const b = key(q);
    if (a === b) return p.id - q.id;
    if (a === null) return 1; // empty cells last either way
    if (b === null) return -1;
    return (a < b ? -1 : 1) * state.sort.dir;
  });
  const filter = $("filter").value.trim().toLowerCase();
  const shown = rows.filter((t) => !filter || cols.map((c) => String(c.get(t))).join(" ")
    .toLowerCase().includes(filter));
  $("trials").tBodies[0].replaceChildren(...shown.map((t) => {
    const tr = el("tr", { class: t.id === study.best || study.front.includes(t.id) ? "best" : "",
                          "data-trial": String(t.id) });
    for (const c of cols) {
      const text = c.show ? c.show(t) : fmt(c.get(t));
      const cls = [c.num ? "num" : "", c.key === "changed" ? "knobs" : "",
                   c.key === "status" ? t.status : "", c.key === "ok" ? c.get(t) : ""];
      tr.append(el("td", { class: cls.filter((x) => x).join(" "), text }));
    }
    return tr;
  }));
  $("trials-note").textContent = `${shown.length} of ${study.trials.length}; click a column ` +
    "to sort; the best is shaded";
}

$("filter").addEventListener("input", renderTable);
poll();
