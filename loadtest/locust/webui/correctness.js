// The Correctness tab once Locust's runner has stopped. Locust's UI polls its statistics, which carry sotw's
// tabs, only while a run spawns or runs: after Stop the tab would keep the rows of its last poll while sotw
// still verifies the run. So while the runner is not running, this script shows the tab's rows as they are now
// (./sotw/correctness, once a second: the verification's progress, then the verdict) in a table of its own in
// place of Locust's, which it hides until a run starts again.
(function () {
  "use strict";
  var script = document.currentScript;
  var base = script ? script.src.replace(/\/sotw\/static\/correctness\.js.*$/, "") : "";
  var box = document.createElement("div");
  box.id = "sotw-correctness-live";
  box.style.cssText = "padding:8px 16px;font:14px/1.5 sans-serif;background:#fff;border-radius:4px;" +
    "box-shadow:0 1px 3px rgba(0,0,0,.2);margin-top:8px";
  var hidden = null; // Locust's table (its container), while this box stands in for it
  var last = null;

  function escape(text) {
    return String(text).replace(/[&<>"]/g, function (c) { return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]; });
  }

  // Locust's table of the Correctness tab (rendered only while the tab is shown): its header is Check / So far.
  function locustTable() {
    var tables = document.querySelectorAll("table");
    for (var i = 0; i < tables.length; i++) {
      var head = tables[i].querySelector("thead");
      if (head && head.textContent.indexOf("Check") >= 0 && head.textContent.indexOf("So far") >= 0) return tables[i];
    }
    return null;
  }

  function restore() {
    if (hidden) hidden.style.display = "";
    hidden = null;
    if (box.parentNode) box.parentNode.removeChild(box);
  }

  function place() {
    var data = last;
    var running = !data || data.runner_state === "running" || data.runner_state === "spawning";
    var table = running ? null : locustTable();
    if (!table) { restore(); return; }
    var container = table.closest(".MuiTableContainer-root") || table.parentElement;
    if (hidden !== container) { restore(); hidden = container; }
    container.style.display = "none";
    if (box.parentNode !== container.parentNode || box.previousSibling !== container) {
      container.parentNode.insertBefore(box, container.nextSibling);
    }
  }

  function render(data) {
    last = data;
    box.innerHTML = '<table style="border-collapse:collapse"><thead><tr>' +
      '<th style="text-align:left;padding:6px 24px 6px 0">Check</th><th style="text-align:left">Now</th></tr></thead><tbody>' +
      data.rows.map(function (r) {
        return '<tr><td style="padding:4px 24px 4px 0;border-top:1px solid #eee">' + escape(r.name) +
          '</td><td style="border-top:1px solid #eee">' + escape(r.value) + "</td></tr>";
      }).join("") + "</tbody></table>";
    place();
  }

  function poll() {
    fetch(base + "/sotw/correctness", { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(render)
      .catch(function () {})
      .finally(function () { setTimeout(poll, 1000); });
  }

  setInterval(place, 250); // follows tab switches between two polls
  poll();
})();
