// PagedTable shows any number of rows one page at a time (100 by default). It keeps one
// <tr> per visible row and, on every update, rewrites only the cells whose text changed:
// 10,000 hosts cost a sort and a slice, never 10,000 DOM rows.

export class PagedTable {
  // columns: [{key, label, text(row) → string, sort?(row) → number|string, num?: bool,
  //            cls?(row) → string, render?(td, row)}]
  constructor(root, { columns, rowKey, pageSize = 100, empty = "Nothing to show.", sort = null, label = "" }) {
    this.columns = columns;
    this.rowKey = rowKey;
    this.pageSize = pageSize;
    this.page = 0;
    this.rows = [];
    this.sort = sort; // {key, dir: 1 | -1}
    this.root = root;

    const wrap = el("div", "table-wrap");
    this.table = el("table", "data");
    if (label) this.table.setAttribute("aria-label", label);
    const thead = el("thead");
    const hr = el("tr");
    this.ths = columns.map((c) => {
      const th = el("th", c.num ? "num" : "");
      th.textContent = c.label;
      th.dataset.key = c.key;
      if (c.sortable !== false) {
        th.classList.add("sortable");
        th.tabIndex = 0;
        const toggle = () => {
          this.sort = this.sort && this.sort.key === c.key ? { key: c.key, dir: -this.sort.dir } : { key: c.key, dir: c.num ? -1 : 1 };
          this.page = 0;
          this.render();
        };
        th.addEventListener("click", toggle);
        th.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); toggle(); } });
      }
      hr.appendChild(th);
      return th;
    });
    thead.appendChild(hr);
    this.tbody = el("tbody");
    this.table.append(thead, this.tbody);
    wrap.appendChild(this.table);

    this.emptyEl = el("div", "empty");
    this.emptyEl.textContent = empty;

    this.pager = el("div", "pager");
    this.info = el("span", "pager-info");
    this.prev = button("‹ Previous", () => { this.page--; this.render(); });
    this.next = button("Next ›", () => { this.page++; this.render(); });
    this.pageLabel = el("span", "pager-page");
    this.pager.append(this.info, this.prev, this.pageLabel, this.next);

    root.append(wrap, this.emptyEl, this.pager);
  }

  setEmptyText(t) {
    this.emptyEl.textContent = t;
  }

  // setRows replaces the data (any length) and redraws the current page.
  setRows(rows) {
    this.rows = rows;
    this.render();
  }

  sorted() {
    if (!this.sort) return this.rows;
    const col = this.columns.find((c) => c.key === this.sort.key);
    if (!col) return this.rows;
    const key = col.sort || col.text;
    const dir = this.sort.dir;
    const decorated = this.rows.map((r, i) => [key(r), i, r]);
    decorated.sort((a, b) => (a[0] < b[0] ? -dir : a[0] > b[0] ? dir : a[1] - b[1]));
    return decorated.map((d) => d[2]);
  }

  render() {
    const rows = this.sorted();
    const pages = Math.max(1, Math.ceil(rows.length / this.pageSize));
    this.page = Math.min(Math.max(0, this.page), pages - 1);
    const start = this.page * this.pageSize;
    const view = rows.slice(start, start + this.pageSize);

    this.ths.forEach((th) => {
      const on = this.sort && th.dataset.key === this.sort.key;
      th.classList.toggle("sorted-asc", !!on && this.sort.dir === 1);
      th.classList.toggle("sorted-desc", !!on && this.sort.dir === -1);
      th.setAttribute("aria-sort", on ? (this.sort.dir === 1 ? "ascending" : "descending") : "none");
    });

    const trs = this.tbody.children;
    for (let i = 0; i < view.length; i++) {
      let tr = trs[i];
      if (!tr) {
        tr = el("tr");
        for (const c of this.columns) tr.appendChild(el("td", c.num ? "num" : ""));
        this.tbody.appendChild(tr);
      }
      tr.hidden = false;
      const r = view[i];
      tr.dataset.key = this.rowKey(r);
      this.columns.forEach((c, j) => {
        const td = tr.children[j];
        if (c.render) {
          c.render(td, r);
        } else {
          setText(td, c.text(r));
        }
        const cls = (c.num ? "num " : "") + (c.cls ? c.cls(r) : "");
        if (td.className !== cls.trim()) td.className = cls.trim();
      });
    }
    for (let i = view.length; i < trs.length; i++) trs[i].hidden = true;

    this.emptyEl.hidden = rows.length > 0;
    this.pager.hidden = rows.length <= this.pageSize;
    const fmt = (n) => n.toLocaleString("en-US");
    this.info.textContent = rows.length ? `${fmt(start + 1)}–${fmt(start + view.length)} of ${fmt(rows.length)}` : "";
    this.pageLabel.textContent = `Page ${fmt(this.page + 1)} of ${fmt(pages)}`;
    this.prev.disabled = this.page === 0;
    this.next.disabled = this.page >= pages - 1;
  }
}

export function el(tag, cls = "") {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  return e;
}

export function button(text, onClick, cls = "btn") {
  const b = el("button", cls);
  b.type = "button";
  b.textContent = text;
  b.addEventListener("click", onClick);
  return b;
}

export function setText(node, text) {
  if (node.childNodes.length === 1 && node.firstChild.nodeType === Node.TEXT_NODE) {
    if (node.firstChild.data !== text) node.firstChild.data = text;
    return;
  }
  node.textContent = text;
}

// setBadge makes td hold one <span class="badge badge-KIND">text</span>, reusing it.
export function setBadge(td, text, kind) {
  let s = td.firstElementChild;
  if (!s || td.childNodes.length !== 1 || s.tagName !== "SPAN") {
    td.textContent = "";
    s = el("span");
    td.appendChild(s);
  }
  const cls = "badge badge-" + kind;
  if (s.className !== cls) s.className = cls;
  setText(s, text);
}
