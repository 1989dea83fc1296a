"use strict";
// Sort a board by a click on a column header (again: the other way); empty cells stay last.
// Filter every board of the page by probe family and token view.
(function () {
  function key(tr, i) {
    const td = tr.cells[i];
    const raw = td.dataset.sort !== undefined ? td.dataset.sort : td.textContent.trim();
    if (raw === "" || raw === "—") return null;
    const n = Number(raw);
    return Number.isNaN(n) ? raw : n;
  }
  for (const th of document.querySelectorAll("table.board th")) {
    th.addEventListener("click", () => {
      const table = th.closest("table");
      const body = table.tBodies[0];
      const i = th.cellIndex;
      const dir = th.dataset.dir === "desc" ? "asc" : th.dataset.dir === "asc" ? "desc" : th.dataset.first || "asc";
      for (const h of table.tHead.rows[0].cells) delete h.dataset.dir;
      th.dataset.dir = dir;
      const rows = [...body.rows];
      rows.sort((a, b) => {
        const x = key(a, i), y = key(b, i);
        if (x === null || y === null) return (x === null) - (y === null);
        const c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
        return dir === "asc" ? c : -c;
      });
      for (const r of rows) body.appendChild(r);
    });
  }
  const probe = document.getElementById("filter-probe");
  const tokens = document.getElementById("filter-tokens");
  function filter() {
    for (const tr of document.querySelectorAll("table.board tbody tr")) {
      tr.hidden = (probe && probe.value && tr.dataset.probe !== probe.value) ||
                  (tokens && tokens.value && tr.dataset.tokens !== tokens.value);
    }
  }
  for (const s of [probe, tokens]) if (s) s.addEventListener("change", filter);
})();
