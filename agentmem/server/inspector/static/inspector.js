// The inspector's only script: the fidelity chart, the entries filter, copy buttons and the forget confirmation.
// Pages work without it (forms submit, ids are select-all).
(function () {
  "use strict";
  var svg = document.getElementById("fidelity");
  if (svg) {
    var points = JSON.parse(svg.getAttribute("data-points") || "[]");
    var NS = "http://www.w3.org/2000/svg", w = +svg.getAttribute("width"), h = +svg.getAttribute("height"), pad = 28;
    var text = function (x, y, s) { var t = document.createElementNS(NS, "text"); t.setAttribute("x", x);
      t.setAttribute("y", y); t.setAttribute("font-size", "11"); t.setAttribute("fill", "#718096"); t.textContent = s; svg.appendChild(t); };
    if (!points.length) {
      text(pad, h / 2, "no scored requests yet");
    } else {
      var max = Math.max.apply(null, points.map(function (p) { return p.kl; })) || 1e-9;
      var x = function (i) { return pad + (points.length === 1 ? 0 : i * (w - 2 * pad) / (points.length - 1)); };
      var y = function (v) { return h - pad - v / max * (h - 2 * pad); };
      var d = points.map(function (p, i) { return (i ? "L" : "M") + x(i).toFixed(1) + " " + y(p.kl).toFixed(1); }).join(" ");
      var path = document.createElementNS(NS, "path");
      path.setAttribute("d", d); path.setAttribute("fill", "none"); path.setAttribute("stroke", "#3182ce");
      path.setAttribute("stroke-width", "2"); path.setAttribute("id", "fidelity-line"); svg.appendChild(path);
      points.forEach(function (p, i) { var c = document.createElementNS(NS, "circle"); c.setAttribute("cx", x(i));
        c.setAttribute("cy", y(p.kl)); c.setAttribute("r", 3); c.setAttribute("fill", "#3182ce"); c.setAttribute("class", "fidelity-point"); svg.appendChild(c); });
      text(2, pad, max.toExponential(1)); text(2, h - pad, "0"); text(pad, h - 6, "oldest"); text(w - pad - 40, h - 6, "latest");
    }
  }
  var filter = document.getElementById("entry-filter");
  if (filter) {
    filter.addEventListener("input", function () {
      var q = filter.value.toLowerCase();
      document.querySelectorAll(".entry-row").forEach(function (row) {
        row.style.display = row.getAttribute("data-search").indexOf(q) >= 0 ? "" : "none";
      });
    });
  }
})();
// Copy buttons (the full entry id) and a confirmation before forgetting an entry.
(function () {
  "use strict";
  document.querySelectorAll("button.copy").forEach(function (button) {
    button.addEventListener("click", function () {
      var id = button.getAttribute("data-copy");
      var done = function () { button.textContent = "copied"; };
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(id).then(done, function () { button.textContent = "select and copy"; });
      } else {
        button.textContent = "select and copy";  // the id itself is select-all on click
      }
    });
  });
  document.querySelectorAll("form.forget-form").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.getAttribute("data-confirm"))) { event.preventDefault(); }
    });
  });
})();
