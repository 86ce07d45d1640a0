// loadgen's HTML report: draws the chart specs of <script id="loadgen-charts"> with
// BokehJS (inlined before this script). A spec (loadgen/results/html_data.py):
//   id, title, x_label, y_label         the element to draw in and the texts
//   series: [{name, x, y, color, dash}] lines (null in y: a gap; a value with no value beside
//                                       it is drawn as a dot, since a line needs two)
//   kind: "bar", categories: [...]      bars over named categories instead of lines
//   group                               charts of one group share their x range (pan and zoom together)
//   x_log, y_log                        log axes
//   x_ticks: {values, labels}           fixed ticks with their labels (the percentile axis)
//   spans: [{y, label}]                 horizontal lines (latency bounds)
//   markers                             a dot at each point too
//   series[].labels: [...]              a text beside each point (a sweep point's load)
// When every chart is drawn, <body data-ready="1"> (or "error", with the error logged).
(function () {
  "use strict";
  var B = window.Bokeh;
  var ranges = {};

  function numbers(values) {
    return values.map(function (v) { return v === null ? NaN : v; });
  }

  function extent(spec) {
    var lo = Infinity, hi = -Infinity;
    spec.series.forEach(function (s) {
      s.x.forEach(function (v) { if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
    });
    return lo <= hi ? [lo, hi > lo ? hi : lo + 1] : [0, 1];
  }

  function xRange(spec) {
    if (spec.categories) { return spec.categories; }
    if (!spec.group) { return undefined; }
    var e = extent(spec);
    var r = ranges[spec.group];
    if (!r) {
      r = ranges[spec.group] = new B.Range1d({start: Math.min(0, e[0]), end: e[1]});
    } else {
      r.start = Math.min(r.start, e[0]);
      r.end = Math.max(r.end, e[1]);
    }
    return r;
  }

  function figure(spec) {
    var options = {
      title: spec.title, name: spec.id, height: spec.height || 280, sizing_mode: "stretch_width",
      tools: "pan,box_zoom,wheel_zoom,reset,save", toolbar_location: "right",
      x_axis_label: spec.x_label || "", y_axis_label: spec.y_label || "",
      x_axis_type: spec.x_log ? "log" : "linear", y_axis_type: spec.y_log ? "log" : "linear"
    };
    var range = xRange(spec);
    if (range !== undefined) { options.x_range = range; }
    if (spec.categories) { options.x_axis_type = "auto"; }
    var p = B.Plotting.figure(options);
    p.toolbar.logo = null;
    p.add_tools(new B.HoverTool({tooltips: [["", "$name"], ["x", "$x{0.[000]}"], ["y", "$y{0.[000]}"]]}));
    return p;
  }

  // The values of a line with no value on either side (between gaps, or a line of one
  // point), the others NaN: a line draws nothing there, so they get a dot.
  function isolated(y) {
    var some = false;
    var out = y.map(function (v, i) {
      var alone = v !== null && (i === 0 || y[i - 1] === null) && (i === y.length - 1 || y[i + 1] === null);
      some = some || alone;
      return alone ? v : NaN;
    });
    return some ? out : null;
  }

  function addSeries(p, spec, s) {
    var source = new B.ColumnDataSource({data: {x: spec.categories ? s.x : numbers(s.x), y: numbers(s.y)}});
    if (spec.kind === "bar") {
      p.vbar({x: {field: "x"}, top: {field: "y"}, width: 0.7, source: source, fill_color: s.color,
              line_color: s.color, name: s.name});
      return;
    }
    p.line({x: {field: "x"}, y: {field: "y"}, source: source, line_color: s.color, line_width: 2,
            line_dash: s.dash || "solid", legend_label: s.name, name: s.name});
    var alone = spec.markers ? null : isolated(s.y);
    if (spec.markers || alone) {
      var dots = alone ? new B.ColumnDataSource({data: {x: numbers(s.x), y: alone}}) : source;
      p.scatter({x: {field: "x"}, y: {field: "y"}, source: dots, size: alone ? 7 : 5, fill_color: s.color,
                 line_color: s.color, legend_label: s.name, name: s.name});
    }
    if (s.labels) {
      var texts = new B.ColumnDataSource({data: {x: numbers(s.x), y: numbers(s.y), text: s.labels}});
      p.add_layout(new B.LabelSet({x: {field: "x"}, y: {field: "y"}, text: {field: "text"}, source: texts,
                                   x_offset: 5, y_offset: 5, text_font_size: "11px", text_color: s.color}));
    }
  }

  function decorate(p, spec) {
    (spec.spans || []).forEach(function (span) {
      p.add_layout(new B.Span({location: span.y, dimension: "width", line_color: "#c00000", line_width: 2,
                               line_dash: "dashed"}));
      p.add_layout(new B.Label({x: extent(spec)[1], y: span.y, text: span.label, text_align: "right",
                                text_color: "#c00000", text_font_size: "11px", y_offset: 3}));
    });
    if (spec.x_ticks) {
      var overrides = new Map();
      spec.x_ticks.values.forEach(function (v, i) { overrides.set(v, spec.x_ticks.labels[i]); });
      p.xaxis.ticker = new B.FixedTicker({ticks: spec.x_ticks.values});
      p.xaxis.major_label_overrides = overrides;
    }
    if (spec.kind !== "bar") {
      p.legend.location = "top_left";
      p.legend.click_policy = "hide";
      p.legend.label_text_font_size = "11px";
      p.legend.background_fill_alpha = 0.7;
    }
  }

  function draw(spec) {
    var p = figure(spec);
    spec.series.forEach(function (s) { addSeries(p, spec, s); });
    decorate(p, spec);
    return p;
  }

  // One document holds every chart, so that charts of one group can share their x range;
  // each chart is shown in its own element.
  function drawAll() {
    var specs = JSON.parse(document.getElementById("loadgen-charts").textContent);
    var doc = new B.Document();
    var targets = [];
    var shown;
    try {
      specs.forEach(function (spec) {
        doc.add_root(draw(spec));
        targets.push(document.getElementById(spec.id));
      });
      shown = B.embed.add_document_standalone(doc, document.getElementById("loadgen-charts").parentNode, targets);
    } catch (err) {
      shown = Promise.reject(err);
    }
    Promise.resolve(shown).then(function () {
      document.body.setAttribute("data-ready", "1");
    }, function (err) {
      document.body.setAttribute("data-ready", "error");
      console.error("loadgen report: the charts could not be drawn: " + err);
    });
  }

  // Charts laid out for the screen are laid out again for the page when printing.
  window.addEventListener("beforeprint", function () { window.dispatchEvent(new Event("resize")); });
  window.addEventListener("afterprint", function () { window.dispatchEvent(new Event("resize")); });
  if (!B || !B.Plotting) {
    document.body.setAttribute("data-ready", "error");
    console.error("loadgen report: BokehJS is missing");
    return;
  }
  drawAll();
})();
