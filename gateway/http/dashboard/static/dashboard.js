// The edgerun usage dashboard: asks for a token, reads /dashboard/api/*, draws with uPlot.
// No framework and no build step. Text from the server is only ever set as textContent.
"use strict";

(() => {
  const TOKEN_KEY = "edgerun.dashboard.token";
  const REFRESH_MS = 5000; // at least; a slow answer (a long range of a busy ledger) spaces refreshes out
  const $ = (id) => document.getElementById(id);
  const state = { charts: {}, timer: null, loads: 0, busy: false, again: false, tookMs: 0, chain: 0 };

  // ---- formatting ----------------------------------------------------------------------------
  const dash = "–";
  const int = (n) => (n === null || n === undefined ? dash : String(n));
  const usd = (micro) => (micro === null || micro === undefined ? dash : "$" + (micro / 1e6).toFixed(6));
  const pct = (ratio) => (ratio === null || ratio === undefined ? dash : (ratio * 100).toFixed(1) + "%");
  const compact = (n) => {
    const a = Math.abs(n);
    if (a >= 1e9) return +(n / 1e9).toPrecision(3) + "G";
    if (a >= 1e6) return +(n / 1e6).toPrecision(3) + "M";
    if (a >= 1e3) return +(n / 1e3).toPrecision(3) + "k";
    return String(+n.toPrecision(3));
  };
  const ms = (s) => (s === null || s === undefined ? dash : (s * 1000).toFixed(1) + " ms");

  // ---- the API ---------------------------------------------------------------------------------
  async function api(path) {
    const res = await fetch(path, {
      headers: { Authorization: "Bearer " + sessionStorage.getItem(TOKEN_KEY) },
      cache: "no-store",
    });
    const body = await res.json().catch(() => null);
    if (!res.ok) {
      const first = body && body.errors && body.errors[0];
      const error = new Error(first ? first.message : "HTTP " + res.status);
      error.status = res.status;
      throw error;
    }
    return body;
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message || "";
    box.hidden = !message;
  }

  // ---- login -----------------------------------------------------------------------------------
  function showLogin(message) {
    stopLive();
    $("main").hidden = true;
    $("logout").hidden = true;
    $("scope").textContent = "";
    $("login").hidden = false;
    showError(message);
  }

  async function enter() {
    try {
      const who = await api("/dashboard/api/tenants");
      fillTenants(who);
      $("login").hidden = true;
      $("main").hidden = false;
      $("logout").hidden = false;
      showError("");
      await refresh();
      startLive();
    } catch (error) {
      // Keep the token only when a retry may work: the gateway itself failed (5xx) or the key is over
      // its requests per minute (429).
      if (!(error.status >= 500 || error.status === 429)) sessionStorage.removeItem(TOKEN_KEY);
      showLogin(error.message);
    }
  }

  function fillTenants(who) {
    const select = $("tenant");
    select.replaceChildren();
    if (who.admin) select.append(new Option("all tenants", ""));
    for (const t of who.tenants) select.append(new Option(t.id + (t.name && t.name !== t.id ? " (" + t.name + ")" : ""), t.id));
    select.disabled = !who.admin;
    $("scope").textContent = who.admin ? "admin: every tenant" : "tenant " + (who.tenants[0] ? who.tenants[0].id : "");
  }

  // ---- refresh ---------------------------------------------------------------------------------
  function query() {
    const to = Date.now() / 1000;
    const from = to - Number($("range").value);
    const params = new URLSearchParams({ from: from.toFixed(3), to: to.toFixed(3) });
    if ($("tenant").value) params.set("tenant", $("tenant").value);
    return params;
  }

  async function refresh() {
    if (state.busy) {
      state.again = true; // a change while a refresh runs: refresh once more when it ends
      return;
    }
    state.busy = true;
    const started = performance.now();
    try {
      const summary = await api("/dashboard/api/usage?" + query());
      state.tookMs = performance.now() - started;
      render(summary);
      showError("");
      state.loads += 1;
      const updated = $("updated");
      updated.dataset.loads = String(state.loads);
      updated.dataset.range = $("range").value;
      updated.dataset.tenant = $("tenant").value;
      updated.textContent = "updated " + new Date().toLocaleTimeString();
    } catch (error) {
      if (error.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        showLogin(error.message);
      } else {
        showError(error.message);
      }
    } finally {
      state.busy = false;
      if (state.again) {
        state.again = false;
        refresh();
      }
    }
  }

  function startLive() {
    stopLive();
    if (!$("live").checked) return;
    const chain = state.chain; // a later stop or start ends this chain
    const tick = async () => {
      await refresh();
      if (state.chain === chain) state.timer = setTimeout(tick, Math.max(REFRESH_MS, 4 * state.tookMs));
    };
    state.timer = setTimeout(tick, REFRESH_MS);
  }

  function stopLive() {
    state.chain += 1;
    if (state.timer !== null) clearTimeout(state.timer);
    state.timer = null;
  }

  // ---- rendering -------------------------------------------------------------------------------
  function kpi(id, text, value) {
    const el = $(id);
    el.textContent = text;
    el.dataset.value = value === null || value === undefined ? "" : String(value);
  }

  function render(s) {
    const t = s.totals;
    kpi("kpi-requests", int(t.requests), t.requests);
    kpi("kpi-prompt-tokens", int(t.prompt_tokens), t.prompt_tokens);
    kpi("kpi-cached-tokens", int(t.cached_tokens), t.cached_tokens);
    kpi("kpi-cached-share", pct(t.hit_ratio), t.hit_ratio);
    kpi("kpi-completion-tokens", int(t.completion_tokens), t.completion_tokens);
    kpi("kpi-spend", usd(t.cost_micro), t.cost_micro);
    kpi("kpi-saved", usd(t.savings_micro), t.savings_micro);
    kpi("kpi-failed", int(t.failed), t.failed);

    const x = s.series.t;
    chart("requests", x, [["requests", s.series.requests, "#2b6cb0"]]);
    chart("tokens", x, [
      ["prompt", s.series.prompt_tokens, "#2b6cb0"],
      ["cached", s.series.cached_tokens, "#38a169"],
      ["completion", s.series.completion_tokens, "#d69e2e"],
    ]);
    chart("spend", x, [
      ["spend", s.series.cost_micro.map((m) => m / 1e6), "#c53030"],
      ["saved", s.series.savings_micro.map((m) => m / 1e6), "#38a169"],
    ]);

    const lat = s.latency;
    table("latency", [
      ["time to first token", ms(lat.ttft_s.p50), ms(lat.ttft_s.p90), ms(lat.ttft_s.p99), int(lat.ttft_s.count)],
      ["inter-token (mean per request)", ms(lat.itl_s.p50), ms(lat.itl_s.p90), ms(lat.itl_s.p99), int(lat.itl_s.count)],
    ]);
    table("statuses", Object.entries(s.statuses).map(([status, n]) => [status, int(n)]));
    $("errors").hidden = s.errors_by_code === null;
    $("errors").previousElementSibling.hidden = s.errors_by_code === null;
    table("errors", (s.errors_by_code || []).map((e) => [int(e.code), int(e.status), int(e.count)]));
    table("backends", s.backends.map((b) => [
      b.backend_id, b.region || dash, int(b.requests), int(b.total_tokens), pct(b.hit_ratio),
      b.inflight_prefill === null ? dash : b.inflight_prefill + " / " + b.inflight_decode,
      b.healthy === null ? dash : b.healthy ? "yes" : "no",
      cachedTokens(b),
      tierHits(b),
    ]));
    table("regions", s.regions.map((r) => [r.region, int(r.requests), int(r.total_tokens), pct(r.hit_ratio)]));
    table("tenants", s.tenants.map((r) => [r.tenant_id, int(r.requests), int(r.total_tokens), usd(r.cost_micro), usd(r.savings_micro)]));
  }

  // whether the backend says how many prompt tokens it served from cache (billing needs it)
  function cachedTokens(b) {
    if (b.reports_cached_tokens === null) return dash;
    return b.reports_cached_tokens ? "reported" : "unknown: " + b.billing_problem;
  }

  // prompt blocks its tiers below the KV pool supplied (host tier, regional pool), since it started
  function tierHits(b) {
    const hits = b.kv_tier_hit_blocks;
    if (!hits) return dash;
    return Object.entries(hits).map(([tier, n]) => tier + " " + int(n)).join(", ");
  }

  function table(id, rows) {
    const body = $(id).tBodies[0];
    body.replaceChildren(...rows.map((cells) => {
      const tr = document.createElement("tr");
      for (const cell of cells) {
        const td = document.createElement("td");
        td.textContent = cell;
        tr.append(td);
      }
      return tr;
    }));
  }

  function chart(name, x, lines) {
    const data = [x, ...lines.map((l) => l[1])];
    const existing = state.charts[name];
    if (existing && existing._names === lines.map((l) => l[0]).join()) {
      existing.setData(data);
      return;
    }
    if (existing) existing.destroy();
    const target = $("chart-" + name);
    const made = new uPlot({
      width: Math.max(320, target.clientWidth || 480),
      height: 200,
      scales: { x: { time: true } },
      series: [{}, ...lines.map(([label, , stroke]) => ({ label, stroke, width: 2, points: { show: false } }))],
      axes: [{}, { size: 60, values: (u, splits) => splits.map(compact) }],
    }, data, target);
    made._names = lines.map((l) => l[0]).join();
    state.charts[name] = made;
  }

  // ---- wiring ----------------------------------------------------------------------------------
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    enter();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("");
  });
  $("range").addEventListener("change", refresh);
  $("tenant").addEventListener("change", refresh);
  $("live").addEventListener("change", startLive);

  if (sessionStorage.getItem(TOKEN_KEY)) enter();
  else showLogin("");
})();
