// Moat dashboard. Everything on the page is built with createElement and
// textContent: no data ever becomes markup (no innerHTML, no
// insertAdjacentHTML, no document.write). The server has already passed
// every string through output.Sanitize; this file is the second wall.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  let csrf = "";
  let refresh = null;

  // el builds an element: attrs are set as attributes (never as
  // properties that parse markup), children are nodes or text.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "href" && !String(v).startsWith("#")) continue; // in-page links only
      e.setAttribute(k, String(v));
    }
    for (const c of children) add(e, c);
    return e;
  }
  function add(parent, c) {
    if (c === null || c === undefined) return;
    if (Array.isArray(c)) { c.forEach((x) => add(parent, x)); return; }
    parent.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  function table(head, rows) {
    return el("table", {}, el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c))))));
  }
  function cmd(argv) { return (argv || []).join(" "); }
  function dur(ms) { return ms >= 1000 ? (ms / 1000).toFixed(1) + " s" : Math.round(ms || 0) + " ms"; }
  function when(t) { return t ? String(t).replace("T", " ").replace(/\.\d+/, "").replace("Z", " UTC") : ""; }
  function money(v) { return "$" + (v || 0).toFixed(v < 1 ? 6 : 2); }
  function status(msg) { document.getElementById("status").textContent = msg; }

  async function get(path) {
    const r = await fetch("/dashboard/api/" + path, { credentials: "same-origin" });
    if (r.status === 401) { location.assign("/dashboard/login"); throw new Error("logged out"); }
    const body = await r.json();
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }
  async function post(path, v) {
    const r = await fetch("/dashboard/" + path, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Moat-CSRF": csrf },
      body: JSON.stringify(v || {}),
    });
    const body = await r.json();
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }

  function show(title, ...content) {
    const main = document.getElementById("main");
    main.replaceChildren(el("h2", {}, title), ...content);
  }

  function runLink(id) { return el("a", { href: "#run/" + id, class: "id" }, id); }

  function runRows(runs) {
    return runs.map((r) => [runLink(r.id), r.kind, r.key_id || "(cli)", r.status, r.tier,
      r.termination || "", r.status === "running" ? "" : String(r.exit_code), dur(r.wall_ms),
      when(r.started), el("code", {}, cmd(r.command))]);
  }
  const runHead = ["id", "kind", "key", "status", "tier", "termination", "exit", "duration", "started", "command"];

  // barChart draws grouped bars (one group per label) as inline SVG.
  function barChart(labels, series, opts) {
    const w = 720, h = 180, pad = 28;
    const max = Math.max(1, ...series.flatMap((s) => s.values));
    const g = svg("svg", { viewBox: `0 0 ${w} ${h + 40}`, class: "chart", role: "img", "aria-label": opts.title });
    g.appendChild(svg("title", {}, opts.title));
    const slot = (w - pad) / labels.length, bw = slot / (series.length + 1);
    series.forEach((s, si) => s.values.forEach((v, i) => {
      const bh = (v / max) * (h - 10);
      const r = svg("rect", { x: pad + i * slot + si * bw, y: h - bh, width: bw, height: bh, class: "bar " + s.cls });
      r.appendChild(svg("title", {}, `${labels[i]}: ${v} ${s.name}`));
      g.appendChild(r);
    }));
    g.appendChild(svg("text", { x: 0, y: 12, class: "axis" }, String(max)));
    g.appendChild(svg("text", { x: 0, y: h, class: "axis" }, "0"));
    labels.forEach((l, i) => {
      if (i % opts.every === 0) g.appendChild(svg("text", { x: pad + i * slot, y: h + 14, class: "axis" }, l));
    });
    series.forEach((s, si) => {
      g.appendChild(svg("rect", { x: pad + si * 120, y: h + 24, width: 10, height: 10, class: "bar " + s.cls }));
      g.appendChild(svg("text", { x: pad + si * 120 + 14, y: h + 33, class: "axis" }, s.name));
    });
    return g;
  }

  // hbarChart draws one horizontal bar per label.
  function hbarChart(labels, values, fmt, title) {
    const w = 720, row = 22, lw = 160;
    const max = Math.max(1e-12, ...values);
    const g = svg("svg", { viewBox: `0 0 ${w} ${row * labels.length + 8}`, class: "chart", role: "img", "aria-label": title });
    g.appendChild(svg("title", {}, title));
    labels.forEach((l, i) => {
      g.appendChild(svg("text", { x: 0, y: i * row + 15, class: "axis" }, l));
      const bw = (values[i] / max) * (w - lw - 90);
      g.appendChild(svg("rect", { x: lw, y: i * row + 4, width: Math.max(bw, 1), height: row - 8, class: "bar cost" }));
      g.appendChild(svg("text", { x: lw + bw + 6, y: i * row + 15, class: "axis" }, fmt(values[i])));
    });
    return g;
  }

  const views = {
    async overview() {
      const [tl, runs, sbs, aps] = await Promise.all([get("timeline"), get("runs?limit=10"), get("sandboxes"), get("approvals")]);
      const labels = tl.buckets.map((b) => String(b.start).slice(11, 16));
      show("Overview",
        el("p", { class: "summary" }, `${sbs.sandboxes.length} live sandboxes, ${aps.approvals.length} commands waiting for approval.`),
        el("h3", {}, "Runs and denials, last 24 hours (UTC)"),
        barChart(labels, [
          { name: "runs", cls: "runs", values: tl.buckets.map((b) => b.runs) },
          { name: "network denials", cls: "denials", values: tl.buckets.map((b) => b.denials) },
          { name: "violations", cls: "violations", values: tl.buckets.map((b) => b.violations) },
        ], { title: "runs and denials per hour", every: 3 }),
        el("h3", {}, "Latest runs"), table(runHead, runRows(runs.runs)));
    },
    async runs() {
      const runs = await get("runs?limit=200");
      show("Runs", el("p", {}, "Newest first; every key's one-shot runs, sessions, commands and approvals."),
        table(runHead, runRows(runs.runs)));
    },
    async run(id) {
      const v = await get("runs/" + encodeURIComponent(id));
      const r = v.record, res = v.result;
      const parts = [
        table(["field", "value"], [
          ["kind", r.kind], ["key", r.key_id || "(cli)"], ["sandbox", r.sandbox_id || ""], ["status", r.status],
          ["tier", r.tier], ["image", r.image], ["termination", r.termination || ""], ["exit code", String(r.exit_code)],
          ["duration", dur(r.wall_ms)], ["cpu", dur(r.cpu_ms)], ["peak memory", String(r.peak_memory_bytes) + " B"],
          ["started", when(r.started)], ["command", el("code", {}, cmd(r.command))], ["error", r.error || ""],
          ["incident", res && res.incident ? el("a", { href: "#incident/" + res.incident }, res.incident) : ""],
        ]),
        el("h3", {}, "Violations"),
        (r.violations || []).length ? table(["kind", "detail", "limit"], r.violations.map((x) => [x.kind, x.detail, x.limit || ""])) : el("p", {}, "none"),
      ];
      if (res) {
        parts.push(el("h3", {}, "Findings"),
          (res.findings || []).length ? table(["kind", "where", "offset", "preview"], res.findings.map((f) => [f.kind, f.where, String(f.offset), f.preview || ""])) : el("p", {}, "none"));
      }
      parts.push(el("h3", {}, "Network"),
        (r.network || []).length ? table(["time", "method", "host", "port", "allowed", "reason"],
          r.network.map((n) => [when(n.time), n.method, n.host, String(n.port), n.allowed ? "yes" : "no", n.reason])) : el("p", {}, "no attempts"));
      if (res) {
        parts.push(el("h3", {}, "Files"),
          v.files.length ? table(["change", "type", "path", "size"], v.files.map((f) => [f.change, f.type, el("code", {}, f.path + (f.target ? " -> " + f.target : "")), String(f.size)])) : el("p", {}, "no changes"),
          el("h3", {}, "stdout" + (res.stdout.truncated ? " (truncated)" : "")), el("pre", { id: "stdout", class: "output" }, v.stdout),
          el("h3", {}, "stderr" + (res.stderr.truncated ? " (truncated)" : "")), el("pre", { id: "stderr", class: "output" }, v.stderr));
      } else {
        parts.push(el("p", {}, r.status === "running" ? "Still running: its output is shown once it has ended." :
          "The server no longer holds this output (it keeps the last --keep-runs one-shot runs, and the last commands of live sandboxes)."));
      }
      show("Run " + id, ...parts);
    },
    async sandboxes() {
      const v = await get("sandboxes");
      show("Live sandboxes", table(["id", "key", "state", "tier", "image", "commands", "created", "expires"],
        v.sandboxes.map((s) => [s.id, s.key_id, s.state, s.tier, s.image.name, String(s.execs), when(s.created_at), when(s.expires_at)])));
    },
    async network() {
      const v = await get("network");
      const reasons = (m) => Object.entries(m).map(([k, n]) => `${k} ×${n}`).join(", ");
      show("Network destinations", el("p", {}, `From the latest ${v.records} records.`),
        table(["host", "port", "allowed", "refused", "why refused", "last"],
          v.destinations.map((d) => [d.host || "(no host)", String(d.port), String(d.allowed), String(d.denied), reasons(d.reasons), when(d.last)])));
    },
    async approvals() {
      const v = await get("approvals");
      const rows = v.approvals.map((a) => {
        const reason = el("input", { type: "text", class: "reason", placeholder: "reason (for the audit log)", "data-approval": a.id });
        const out = el("span", { class: "outcome" });
        const decide = (approve) => async () => {
          out.textContent = approve ? "running…" : "denying…";
          try {
            const o = await post("api/approvals/" + encodeURIComponent(a.id), { approve, reason: reason.value });
            out.replaceChildren(o.approval.state);
            if (o.run) out.append(": run ", runLink(o.run.id), ` exit ${o.run.result.exit_code}`);
            if (o.exec) out.append(`: command ${o.exec.id} ${o.exec.state}`);
          } catch (e) { out.textContent = "failed: " + e.message; }
        };
        const yes = el("button", { type: "button", class: "approve", "data-approval": a.id }, "Approve");
        const no = el("button", { type: "button", class: "deny", "data-approval": a.id }, "Deny");
        yes.addEventListener("click", decide(true));
        no.addEventListener("click", decide(false));
        return [a.id, a.key_id, a.sandbox_id || "(one-shot run)", el("code", {}, cmd(a.argv)),
          el("ul", {}, (a.effects || []).map((e, i) => el("li", {}, `${e.kind}: ${e.detail}` + (a.reasons && a.reasons[i] ? ` (${a.reasons[i]})` : "")))),
          when(a.expires_at), [reason, yes, no, out]];
      });
      show("Pending approvals", rows.length ? table(["id", "key", "sandbox", "command", "effects", "expires", "decision"], rows) : el("p", {}, "Nothing is waiting for approval."));
    },
    async incidents() {
      const v = await get("incidents");
      if (!v.kept) { show("Incidents", el("p", {}, "This server keeps no incident bundles (--no-incidents or MOAT_INCIDENTS=off).")); return; }
      show("Incidents", table(["id", "time", "run", "key", "tier", "reasons", "commands"],
        v.incidents.map((i) => [el("a", { href: "#incident/" + i.id }, i.id), when(i.time), runLink(i.run_id), i.key, i.tier,
          (i.reasons || []).join("; "), el("code", {}, (i.commands || []).map(cmd).join(" ; "))])));
    },
    async incident(id) {
      const i = await get("incidents/" + encodeURIComponent(id));
      const x = i.exposure || {};
      show("Incident " + id, table(["field", "value"], [
        ["time", when(i.time)], ["run", runLink(i.run_id)], ["key", i.key], ["tier", i.tier],
        ["reasons", el("ul", {}, (i.reasons || []).map((r) => el("li", {}, r)))],
        ["commands", el("ul", {}, (i.commands || []).map((c) => el("li", {}, el("code", {}, cmd(c)))))],
        ["network", `${x.network || ""} ${(x.allow || []).join(", ")}`], ["inputs", (x.inputs || []).join(", ")],
        ["secrets used", (x.secrets_used || []).join(", ")], ["bundle files", el("ul", {}, (i.files || []).map((f) => el("li", {}, el("code", {}, f))))],
        ["bytes", String(i.bytes)],
      ]), el("p", {}, "Export the bundle with: moat incident export " + id + " FILE"));
    },
    async costs() {
      const v = await get("costs");
      const keys = v.per_key.map((k) => k.key_id || "(cli)");
      show("Costs per key",
        el("p", {}, `${v.records} records; total ${money(v.total.price)} (CPU ${v.total.cpu_seconds.toFixed(1)} s, memory ${v.total.gib_seconds.toFixed(2)} GiB·s, wall ${v.total.wall_seconds.toFixed(1)} s), at $${v.prices.cpu_second.toExponential(3)} per CPU-second and $${v.prices.gib_second.toExponential(3)} per GiB-second.`),
        hbarChart(keys, v.per_key.map((k) => k.price), money, "cost per key"),
        table(["key", "records", "cpu s", "GiB·s", "wall s", "cost"], v.per_key.map((k) => [k.key_id || "(cli)", String(k.records),
          k.cpu_seconds.toFixed(2), k.gib_seconds.toFixed(3), k.wall_seconds.toFixed(1), money(k.price)])));
    },
    async suggest() {
      const v = await get("suggest");
      if (v.error) { show("Policy suggest", el("p", {}, v.error)); return; }
      show("Policy suggest", el("p", {}, `moat policy suggest's proposal from ${v.considered} legitimate runs (the latest records).`),
        el("pre", { class: "output" }, v.yaml),
        table(["field", "why"], v.reasons.map((r) => [r.field, r.reason])),
        el("h3", {}, "Left out"), table(["records", "why"], v.ignored.map((c) => [String(c.count), c.name])));
    },
  };

  async function route() {
    if (refresh) { clearTimeout(refresh); refresh = null; }
    const hash = location.hash.slice(1) || "overview";
    const [name, ...rest] = hash.split("/");
    const view = views[name] || views.overview;
    // data-page says which page is on screen once it is drawn (what tests
    // wait for); cleared while the next one loads.
    document.body.removeAttribute("data-page");
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("current", a.getAttribute("href") === "#" + name);
    try {
      await view(decodeURIComponent(rest.join("/")));
      status("updated " + new Date().toISOString().slice(11, 19) + " UTC");
      document.body.setAttribute("data-view", name);
      document.body.setAttribute("data-page", hash);
    } catch (e) {
      show("Error", el("p", { class: "error" }, e.message));
    }
    // Lists refresh themselves; pages with inputs or one run's detail do not.
    if (["overview", "runs", "sandboxes", "network"].includes(name)) refresh = setTimeout(route, 5000);
    pending();
  }

  async function pending() {
    try {
      const v = await get("approvals");
      document.getElementById("pending-count").textContent = v.approvals.length ? `(${v.approvals.length})` : "";
    } catch (e) { /* shown by the view */ }
  }

  async function start() {
    const s = await get("session");
    csrf = s.csrf;
    document.getElementById("who").textContent = `key ${s.key_id} (${s.key_name})`;
    document.getElementById("logout").addEventListener("click", async () => {
      await post("logout");
      location.assign("/dashboard/login");
    });
    window.addEventListener("hashchange", route);
    route();
  }
  start();
})();
