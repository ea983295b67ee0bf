// flywheel report: the x-axis toggle of the learning curves, and the task table with its trajectory viewer.
// Every piece of a record's text is set with textContent: a trajectory is untrusted and cannot add markup.
"use strict";
(function () {
  for (const radio of document.querySelectorAll('input[name="xaxis"]')) {
    radio.addEventListener("change", () => {
      for (const grid of document.querySelectorAll("#curves .charts")) grid.hidden = grid.dataset.x !== radio.value;
    });
  }
  const source = document.getElementById("attempts-data");
  if (!source) return;
  const DATA = JSON.parse(source.textContent);
  const COLS = [
    ["source", "run"], ["task", "task"], ["effort", "effort"], ["step", "step"], ["success", "success"],
    ["reward", "reward"], ["cost", "cost ($)"], ["turns", "turns"], ["first_edit", "1st edit"],
    ["ending", "ending"], ["cheat", "cheat signatures"], ["infra", "infra failure"],
  ];
  const table = document.getElementById("table");
  const tbody = table.querySelector("tbody");
  const filter = document.getElementById("filter");
  let sortKey = null, sortDir = 1, selected = -1;

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function show(key, v) {
    if (v === null || v === undefined || v === "") return "";
    if (key === "success") return v ? "yes" : "no";
    if (key === "cost") return v.toFixed(5);
    if (key === "reward") return typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(4)) : "";
    return String(v);
  }
  function compare(a, b) {
    const x = a[sortKey], y = b[sortKey];
    if (x === y) return 0;
    if (x === null || x === undefined || x === "") return 1;
    if (y === null || y === undefined || y === "") return -1;
    return (x < y ? -1 : 1) * sortDir;
  }
  const head = document.createElement("tr");
  for (const [key, label] of COLS) {
    const th = el("th", label);
    th.dataset.key = key;
    th.addEventListener("click", () => {
      sortDir = sortKey === key ? -sortDir : 1;
      sortKey = key;
      for (const h of head.children) h.className = h.dataset.key === key ? (sortDir > 0 ? "asc" : "desc") : "";
      render();
    });
    head.appendChild(th);
  }
  table.querySelector("thead").appendChild(head);
  const texts = DATA.map((row) => COLS.map(([k]) => show(k, row[k])).join(" ").toLowerCase());

  function render() {
    const q = filter.value.trim().toLowerCase();
    let idx = DATA.map((_, i) => i).filter((i) => !q || q.split(/\s+/).every((w) => texts[i].includes(w)));
    if (sortKey) idx = idx.sort((i, j) => compare(DATA[i], DATA[j]) || i - j);
    tbody.replaceChildren();
    for (const i of idx) {
      const tr = document.createElement("tr");
      tr.dataset.index = i;
      if (i === selected) tr.className = "selected";
      for (const [key] of COLS) {
        const v = DATA[i][key];
        tr.appendChild(el("td", show(key, v), key === "success" ? (v ? "ok" : "bad") : ""));
      }
      tr.addEventListener("click", () => open(i, tr));
      tbody.appendChild(tr);
    }
    document.getElementById("count").textContent = `${idx.length} of ${DATA.length} attempts`;
  }

  function meta(parent, pairs) {
    const p = el("p", null, "meta");
    for (const [k, v] of pairs) {
      if (v === null || v === undefined || v === "") continue;
      p.appendChild(el("span", k + ": "));
      p.appendChild(el("b", v));
      p.appendChild(document.createTextNode("   "));
    }
    parent.appendChild(p);
  }

  function turn(t, n) {
    const failed = t.role === "tool" && t.ok === false;
    const box = el("div", null, `turn ${t.role}${failed ? " failed" : ""}`);
    let who = t.role;
    if (t.role === "assistant") who += ` · model call ${n}` + (t.finish_reason ? ` · ${t.finish_reason}` : "");
    if (t.role === "assistant" && t.completion_tokens !== undefined) who += ` · ${t.completion_tokens} tokens`;
    if (t.role === "tool") who += ` · ${t.name || "?"}` + (failed ? " · failed" : "");
    if (t.role === "system" || t.role === "user") {
      const d = el("details");
      d.open = t.role === "user";
      d.appendChild(el("summary", who, "who"));
      d.appendChild(el("pre", t.text));
      box.appendChild(d);
      return box;
    }
    box.appendChild(el("div", who, "who"));
    if (t.role === "tool" && t.arguments && Object.keys(t.arguments).length) {
      box.appendChild(el("pre", JSON.stringify(t.arguments), "args"));
    }
    box.appendChild(el("pre", t.text));
    return box;
  }

  function verdict(row, r) {
    const v = r.verdict;
    const box = el("div", null, "verdict " + (r.success ? "ok" : "bad"));
    box.appendChild(el("h4", v ? (r.success ? "Verdict: success" : v.cheat ? "Verdict: cheat" : "Verdict: failure") : "Not graded"));
    if (v) {
      meta(box, [
        ["fail→pass", `${v.fail_to_pass.passed}/${v.fail_to_pass.total}`],
        ["pass→pass", `${v.pass_to_pass.passed}/${v.pass_to_pass.total}`],
        ["cheat signatures", (v.signatures || []).join(", ")],
        ["grader error", v.error],
      ]);
      const tests = Object.entries(v.tests || {});
      if (tests.length) box.appendChild(el("pre", tests.map(([k, o]) => `${o.padEnd(8)} ${k}`).join("\n")));
    }
    if (row.kind === "train") {
      const rl = r.rl || {};
      meta(box, [["reward (the trainer's rl.reward)", rl.reward], ["advantage", rl.advantage],
                 ["λ", rl.lambda], ["cost in the reward", rl.cost]]);
    } else {
      meta(box, [["reward at λ=0", r.success ? "1" : "0"]]);
    }
    return box;
  }

  function open(i, tr) {
    selected = i;
    for (const other of tbody.querySelectorAll("tr.selected")) other.className = "";
    if (tr) tr.className = "selected";
    const row = DATA[i], r = row.record;
    const pane = document.getElementById("trajectory");
    pane.replaceChildren();
    pane.appendChild(el("h3", `${r.task_id} · ${r.effort} · ${row.source}`));
    meta(pane, [
      ["id", r.id], ["model", r.model], ["policy version", r.policy_version], ["step", r.step],
      ["ending", r.ending], ["error", r.error], ["infra failure", r.infra_failure],
      ["model calls", r.n_turns], ["tokens", `${r.usage.prompt_tokens} prompt, ${r.usage.completion_tokens} completion`],
      ["cost", `$${r.cost.toFixed(6)}`], ["seconds", r.wall_s], ["format errors", r.format_errors],
      ["steps to first edit", r.steps_to_first_edit],
    ]);
    let n = 0;
    for (const t of r.turns) pane.appendChild(turn(t, t.role === "assistant" ? ++n : n));
    (r.sidekick || []).forEach((s, k) => {  // Fusion: the sidekick's episodes, each folded
      const d = el("details", null, "turn sidekick");
      d.appendChild(el("summary", `sidekick episode ${k + 1} · ${s.model} · ${s.n_turns} model calls · $${s.cost.toFixed(6)}`, "who"));
      let m = 0;
      for (const t of s.turns) d.appendChild(turn(t, t.role === "assistant" ? ++m : m));
      pane.appendChild(d);
    });
    pane.appendChild(verdict(row, r));
    if (location.hash !== "#click-first-row") pane.scrollIntoView({ behavior: "smooth", block: "start" });
  }

  filter.addEventListener("input", render);
  render();
  if (location.hash === "#click-first-row") {  // a hook for the tests: open the first attempt on load
    const first = tbody.querySelector("tr");
    if (first) first.click();
  }
})();
