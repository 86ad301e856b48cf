/* Offline stand-in for Google Charts (https://www.gstatic.com/charts/loader.js), loaded by
 * analysis.tensorboard only when that script could not be fetched (no internet on the machine
 * running the browser). torch-tb-profiler's page waits for google.charts before it renders anything;
 * this provides the part of the API it calls and draws its charts with Chart.js (chart.umd.min.js,
 * vendored from npm beside this file with its licence, loaded first): the execution summary and the
 * operator and kernel pies as doughnuts, the step-time breakdown and the distributed view's stacked
 * bars as stacked bars, the memory curves as lines, the module timeline as floating bars; its tables
 * stay tables. Each chart's data is the plugin's own DataTable; tooltip and other role columns are not
 * series. */
(function () {
  if (window.google && window.google.charts) return;
  var listeners = [];
  var PALETTE = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00",
                 "#b82e2e", "#316395", "#994499", "#22aa99", "#aaaa11", "#6633cc", "#e67300", "#8b0707"];
  function lenient(obj) {  // unknown methods become no-ops instead of errors
    return new Proxy(obj, { get: function (t, p) { return p in t ? t[p] : function () {}; } });
  }
  function cellValue(cell) { return cell && typeof cell === "object" && !(cell instanceof Date) && "v" in cell ? cell.v : cell; }
  function DataTable(data) {
    this.cols = []; this.rows = [];
    if (data && data.cols) {
      var self = this;
      data.cols.forEach(function (c) { self.addColumn(c); });
      (data.rows || []).forEach(function (r) { self.addRow(r.c || []); });
    }
    return lenient(this);
  }
  DataTable.prototype.addColumn = function (type, label) {
    var col = type && typeof type === "object" ? type : { type: type, label: label };
    this.cols.push({ type: col.type, label: col.label || col.id || "", role: col.role });
    return this.cols.length - 1;
  };
  DataTable.prototype.addRows = function (rows) {
    if (typeof rows === "number") { for (var i = 0; i < rows; i++) this.rows.push([]); return; }
    var self = this; rows.forEach(function (r) { self.addRow(r); });
  };
  DataTable.prototype.addRow = function (r) { this.rows.push((r || []).map(cellValue)); return this.rows.length - 1; };
  DataTable.prototype.getNumberOfRows = function () { return this.rows.length; };
  DataTable.prototype.getNumberOfColumns = function () { return this.cols.length; };
  DataTable.prototype.getValue = function (r, c) { return this.rows[r][c]; };
  DataTable.prototype.setCell = function (r, c, v) { this.rows[r][c] = cellValue(v); };
  DataTable.prototype.setValue = DataTable.prototype.setCell;
  DataTable.prototype.getColumnLabel = function (c) { return this.cols[c].label; };
  DataTable.prototype.getColumnType = function (c) { return this.cols[c].type; };
  function arrayToDataTable(array, firstRowIsData) {
    var t = new DataTable(), start = firstRowIsData ? 0 : 1;
    (firstRowIsData ? array[0].map(function () { return ""; }) : array[0]).forEach(function (h) {
      t.addColumn(typeof h === "object" && h ? h : { type: "string", label: String(h) });
    });
    array.slice(start).forEach(function (r) { t.addRow(r); });
    if (!firstRowIsData) {  // a header row names the columns; the first data row says which are numbers
      t.cols.forEach(function (c, i) { if (t.rows.length && typeof t.rows[0][i] === "number") c.type = "number"; });
    }
    return t;
  }
  function text(v) {
    if (v === null || v === undefined) return "";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(2);
    if (v instanceof Date) return v.toISOString();
    return String(v);
  }
  function series(data) {  // the columns after the first that hold numbers and play no role (tooltips...)
    var out = [];
    data.cols.forEach(function (c, i) { if (i > 0 && !c.role && c.type === "number") out.push(i); });
    return out;
  }
  function table(container, data, options) {
    var html = '<div class="offline-chart" style="overflow:auto;max-height:420px;font:12px sans-serif">';
    if (options && options.title) html += "<b>" + text(options.title) + "</b>";
    html += '<table border="1" cellspacing="0" cellpadding="3"><tr>';
    var shown = [];
    data.cols.forEach(function (col, i) { if (!col.role) shown.push(i); });
    shown.forEach(function (i) { html += "<th>" + text(data.cols[i].label) + "</th>"; });
    html += "</tr>";
    data.rows.forEach(function (r) {
      html += "<tr>" + shown.map(function (i) { var v = r[i]; return "<td>" + (typeof v === "string" && v.indexOf("<") >= 0 ? "" : text(v)) + "</td>"; }).join("") + "</tr>";
    });
    container.innerHTML = html + "</table></div>";
  }
  function common(options, legend) {
    return { animation: false, responsive: true, maintainAspectRatio: false,
             plugins: { title: { display: !!(options && options.title), text: options && options.title },
                        legend: { display: legend, position: "bottom" } } };
  }
  function pie(data, options) {
    var values = series(data)[0];
    return { type: "doughnut", data: { labels: data.rows.map(function (r) { return text(r[0]); }),
             datasets: [{ data: data.rows.map(function (r) { return r[values]; }),
                          backgroundColor: (options && options.colors) || PALETTE }] },
             options: common(options, !(options && options.legend === "none")) };
  }
  function bars(data, options, kind) {
    var types = (options && options.series) || {}, stacked = !!(options && options.isStacked);
    var datasets = series(data).map(function (c, n) {
      var line = kind === "line" || (types[n] && types[n].type === "line");
      return { label: data.cols[c].label, data: data.rows.map(function (r) { return r[c]; }),
               type: line ? "line" : "bar", yAxisID: types[n] && types[n].targetAxisIndex === 1 ? "y1" : "y",
               backgroundColor: ((options && options.colors) || PALETTE)[n % PALETTE.length],
               borderColor: ((options && options.colors) || PALETTE)[n % PALETTE.length], pointRadius: 0 };
    });
    var config = { type: kind === "line" ? "line" : "bar",
                   data: { labels: data.rows.map(function (r) { return text(r[0]); }), datasets: datasets },
                   options: common(options, datasets.length > 1) };
    config.options.scales = { x: { stacked: stacked && kind !== "line", title: axisTitle(options, "hAxis") },
                              y: { stacked: stacked && kind !== "line", title: axisTitle(options, "vAxis") } };
    if (datasets.some(function (d) { return d.yAxisID === "y1"; })) config.options.scales.y1 = { position: "right" };
    return config;
  }
  function axisTitle(options, key) {
    var t = options && options[key] && options[key].title;
    return { display: !!t, text: t || "" };
  }
  function timeline(data) {  // rows: layer, name, tooltip, start, end: a floating bar each, one lane a layer
    var cols = series(data), start = cols[0], end = cols[1], name = data.cols.length > 4 ? 1 : 0;
    var lanes = [];
    data.rows.forEach(function (r) { if (lanes.indexOf(text(r[0])) < 0) lanes.push(text(r[0])); });
    return { type: "bar", data: { labels: lanes, datasets: [{ label: "duration", backgroundColor: PALETTE[0],
             data: data.rows.map(function (r) { return { y: text(r[0]), x: [r[start], r[end]], name: r[name] }; }) }] },
             options: Object.assign(common({}, false), { indexAxis: "y" }) };
  }
  var KINDS = { PieChart: pie, ColumnChart: function (d, o) { return bars(d, o, "bar"); },
                BarChart: function (d, o) { return bars(d, o, "bar"); },
                ComboChart: function (d, o) { return bars(d, o, (o && o.seriesType) === "line" ? "line" : "bar"); },
                SteppedAreaChart: function (d, o) { return bars(d, o, "bar"); },  // stacked bars, a step each
                LineChart: function (d, o) { return bars(d, o, "line"); },
                AreaChart: function (d, o) { return bars(d, o, "line"); },
                Timeline: timeline };
  function GoogleChart(kind, container) { this.kind = kind; this.container = container; this.chart = null; return lenient(this); }
  GoogleChart.prototype.draw = function (data, options) {
    var c = this.container; if (!c) return;
    this.clearChart();
    // The page may draw into a container through a new chart object (a re-render): the chart an earlier
    // one drew there is destroyed with it, not left in Chart.instances after its canvas is gone.
    if (window.Chart && typeof window.Chart.getChart === "function") {
      Array.prototype.forEach.call(c.querySelectorAll("canvas"), function (old) {
        var before = window.Chart.getChart(old); if (before) before.destroy();
      });
    }
    data = data || new DataTable();
    if (!KINDS[this.kind] || typeof window.Chart !== "function") {
      table(c, data, options);
    } else {
      var box = document.createElement("div");
      box.className = "offline-chart";
      box.style.position = "relative";
      box.style.height = ((options && typeof options.height === "number" && options.height) || 400) + "px";
      var canvas = document.createElement("canvas");
      box.appendChild(canvas);
      c.innerHTML = "";
      c.appendChild(box);
      this.chart = new window.Chart(canvas, KINDS[this.kind](data, options));
    }
    var self = this;
    setTimeout(function () { listeners.forEach(function (l) { if (l.obj === self && l.ev === "ready") l.cb(); }); }, 0);
  };
  GoogleChart.prototype.clearChart = function () { if (this.chart) { this.chart.destroy(); this.chart = null; } };
  GoogleChart.prototype.getSelection = function () { return []; };
  var viz = { DataTable: DataTable, arrayToDataTable: arrayToDataTable,
    events: { addListener: function (obj, ev, cb) { listeners.push({ obj: obj, ev: ev, cb: cb }); return {}; },
              removeListener: function () {}, removeAllListeners: function () {} } };
  ["ColumnChart", "ComboChart", "LineChart", "PieChart", "SteppedAreaChart", "Table", "Timeline", "BarChart",
   "AreaChart", "ScatterChart"].forEach(function (name) {
    viz[name] = function (c) { return GoogleChart.call(Object.create(GoogleChart.prototype), name, c); };
  });
  window.google = window.google || {};
  window.google.visualization = viz;
  window.google.charts = {
    load: function () { return Promise.resolve(); },
    setOnLoadCallback: function (cb) { setTimeout(cb, 0); },
    offline: true
  };
})();
