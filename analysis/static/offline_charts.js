/* Offline stand-in for Google Charts (https://www.gstatic.com/charts/loader.js), loaded by
 * analysis.tensorboard only when that script could not be fetched (no internet on the machine
 * running the browser). torch-tb-profiler's page waits for google.charts before it renders anything;
 * this provides the API it calls and draws every chart as a plain table of its data, so the
 * Overview, Operator, Kernel and Memory views still show their numbers. */
(function () {
  if (window.google && window.google.charts) return;
  var listeners = [];
  function lenient(obj) {  // unknown methods become no-ops instead of errors
    return new Proxy(obj, { get: function (t, p) { return p in t ? t[p] : function () {}; } });
  }
  function DataTable(data) {
    this.cols = []; this.rows = [];
    if (data && data.cols) {
      var self = this;
      data.cols.forEach(function (c) { self.cols.push({ type: c.type, label: c.label || c.id || "" }); });
      (data.rows || []).forEach(function (r) {
        self.rows.push((r.c || []).map(function (cell) { return cell && typeof cell === "object" ? cell.v : cell; }));
      });
    }
    return lenient(this);
  }
  DataTable.prototype.addColumn = function (type, label) {
    if (type && typeof type === "object") { label = type.label || type.id || ""; type = type.type; }
    this.cols.push({ type: type, label: label || "" }); return this.cols.length - 1;
  };
  DataTable.prototype.addRows = function (rows) {
    if (typeof rows === "number") { for (var i = 0; i < rows; i++) this.rows.push([]); return; }
    var self = this; rows.forEach(function (r) { self.addRow(r); });
  };
  DataTable.prototype.addRow = function (r) {
    this.rows.push((r || []).map(function (cell) { return cell && typeof cell === "object" && "v" in cell ? cell.v : cell; }));
    return this.rows.length - 1;
  };
  DataTable.prototype.getNumberOfRows = function () { return this.rows.length; };
  DataTable.prototype.getNumberOfColumns = function () { return this.cols.length; };
  DataTable.prototype.getValue = function (r, c) { return this.rows[r][c]; };
  DataTable.prototype.setCell = function (r, c, v) { this.rows[r][c] = v; };
  DataTable.prototype.setValue = DataTable.prototype.setCell;
  DataTable.prototype.getColumnLabel = function (c) { return this.cols[c].label; };
  DataTable.prototype.getColumnType = function (c) { return this.cols[c].type; };
  function arrayToDataTable(array, firstRowIsData) {
    var t = new DataTable(), start = firstRowIsData ? 0 : 1;
    (firstRowIsData ? array[0].map(function () { return ""; }) : array[0]).forEach(function (h) {
      t.addColumn(typeof h === "object" && h ? h : { type: "string", label: String(h) });
    });
    array.slice(start).forEach(function (r) { t.addRow(r); });
    return t;
  }
  function text(v) {
    if (v === null || v === undefined) return "";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(2);
    if (v instanceof Date) return v.toISOString();
    return String(v);
  }
  function Chart(container) { this.container = container; return lenient(this); }
  Chart.prototype.draw = function (data, options) {
    var c = this.container; if (!c) return;
    var html = '<div class="offline-chart" style="overflow:auto;max-height:420px;font:12px sans-serif">';
    if (options && options.title) html += "<b>" + text(options.title) + "</b>";
    html += '<table border="1" cellspacing="0" cellpadding="3"><tr>';
    var cols = (data && data.cols) || [];
    var shown = [];
    cols.forEach(function (col, i) { if (!col.role && col.label !== undefined && String(col.type) !== "undefined") { shown.push(i); } });
    shown.forEach(function (i) { html += "<th>" + text(cols[i].label) + "</th>"; });
    html += "</tr>";
    ((data && data.rows) || []).forEach(function (r) {
      html += "<tr>" + shown.map(function (i) { var v = r[i]; return "<td>" + (typeof v === "string" && v.indexOf("<") >= 0 ? "" : text(v)) + "</td>"; }).join("") + "</tr>";
    });
    c.innerHTML = html + "</table></div>";
    var self = this;
    setTimeout(function () { listeners.forEach(function (l) { if (l.obj === self && l.ev === "ready") l.cb(); }); }, 0);
  };
  Chart.prototype.getSelection = function () { return []; };
  var viz = { DataTable: DataTable, arrayToDataTable: arrayToDataTable,
    events: { addListener: function (obj, ev, cb) { listeners.push({ obj: obj, ev: ev, cb: cb }); return {}; },
              removeListener: function () {}, removeAllListeners: function () {} } };
  ["ColumnChart", "ComboChart", "LineChart", "PieChart", "SteppedAreaChart", "Table", "Timeline", "BarChart",
   "AreaChart", "ScatterChart"].forEach(function (name) { viz[name] = function (c) { return Chart.call(Object.create(Chart.prototype), c); }; });
  var pending = [];
  window.google = window.google || {};
  window.google.visualization = viz;
  window.google.charts = {
    load: function () { return Promise.resolve(); },
    setOnLoadCallback: function (cb) { setTimeout(cb, 0); },
    offline: true
  };
})();
