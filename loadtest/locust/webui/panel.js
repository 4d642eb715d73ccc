// The sotw panel: polls ./state once a second, draws the charts, and sends the fault and incident controls.
(function () {
  "use strict";
  var KINDS = ["gap", "duplicate", "delayed", "malformed", "abandon"];
  var COLORS = ["#1565c0", "#c62828", "#2e7d32", "#6a1b9a"];
  var state = null;
  var edited = false; // the operator is typing rates: do not overwrite them

  function $(id) { return document.getElementById(id); }
  function fmt(v, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "-";
    return Number(v).toLocaleString(undefined, { maximumFractionDigits: digits === undefined ? 1 : digits });
  }

  // A small line chart: series = [{name, points: [[x, y], ...]}], x in seconds.
  function chart(el, title, unit, series) {
    var w = el.clientWidth || 600, h = el.clientHeight || 120, left = 48, bottom = 16, top = 14;
    var xs = [], ys = [0];
    series.forEach(function (s) { s.points.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    var svg = '<svg viewBox="0 0 ' + w + " " + h + '" preserveAspectRatio="none">';
    svg += '<text class="title" x="' + left + '" y="10">' + title + " (" + unit + ")</text>";
    if (xs.length) {
      var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs), y1 = Math.max.apply(null, ys) || 1;
      var sx = function (x) { return left + (x1 > x0 ? (x - x0) / (x1 - x0) : 1) * (w - left - 4); };
      var sy = function (y) { return top + (1 - y / y1) * (h - top - bottom); };
      svg += '<line x1="' + left + '" y1="' + sy(0) + '" x2="' + (w - 4) + '" y2="' + sy(0) + '" stroke="#ccc"/>';
      svg += '<text class="axis" x="2" y="' + (sy(y1) + 4) + '">' + fmt(y1) + "</text>";
      svg += '<text class="axis" x="2" y="' + sy(0) + '">0</text>';
      svg += '<text class="axis" x="' + left + '" y="' + (h - 2) + '">' + fmt(x1 - x0, 0) + " s</text>";
      series.forEach(function (s, i) {
        if (!s.points.length) return;
        var d = s.points.map(function (p, k) { return (k ? "L" : "M") + sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1); }).join("");
        svg += '<path d="' + d + '" fill="none" stroke="' + COLORS[i % COLORS.length] + '" stroke-width="1.5"/>';
        svg += '<text class="axis" x="' + (w - 140 + i * 0) + '" y="' + (12 + 11 * i) + '" fill="' + COLORS[i % COLORS.length] + '">' + s.name + "</text>";
      });
    } else {
      svg += '<text class="axis" x="' + left + '" y="' + (h / 2) + '">no data yet</text>';
    }
    el.innerHTML = svg + "</svg>";
  }

  function rates(samples, column) {
    var out = [];
    for (var i = 1; i < samples.length; i++) {
      var a = samples[i - 1], b = samples[i], dt = b.ts - a.ts;
      if (dt > 0 && b[column] !== undefined && a[column] !== undefined) out.push([b.ts, (b[column] - a[column]) / dt]);
    }
    return out;
  }

  function render() {
    var s = state, run = s.run || {}, samples = run.samples || [], last = samples[samples.length - 1] || {};
    $("sotw-phase").textContent = run.phase ? "run " + run.index + ": " + run.phase : "no run yet";
    $("sotw-load").textContent = s.users + " users = " + fmt(s.load, 2) + "x of profile " + s.profile.name +
      " = " + fmt(s.target_rate, 0) + " msg/s asked (" + s.users_per_x + " users make 1x" +
      (s.shape ? ", shape " + s.shape : "") + "); simulators sent " + fmt(s.fleet.sent, 0) +
      ", acknowledged " + fmt(s.fleet.acked, 0);
    var verdict = run.verdict || {};
    var v = $("sotw-verdict");
    v.className = "verdict " + (verdict.verdict || "");
    var check = run.verification || {};
    if (verdict.verdict) {
      v.textContent = "Verdict: " + verdict.verdict + (verdict.reasons && verdict.reasons.length ? ": " + verdict.reasons.join("; ") : "") + " (report: " + verdict.report + ")";
    } else if (check.state === "running") {
      v.textContent = "Being verified after Stop: " + check.step + (check.detail ? ": " + check.detail : "") + " (" + fmt(check.since_stop_s, 0) + " s since Stop)";
    } else if (check.state === "failed") {
      v.className = "verdict FAIL";
      v.textContent = "The verification failed: " + check.error;
    } else {
      v.textContent = "";
    }

    $("sotw-lag-age").textContent = fmt(last.lag_age_s);
    $("sotw-lag-offsets").textContent = fmt(last.lag_offsets, 0);
    var t = function (col) { return samples.filter(function (r) { return r[col] !== undefined && r[col] !== null; }).map(function (r) { return [r.ts, r[col]]; }); };
    chart($("chart-lag-age"), "age of the oldest unprocessed message", "s", [{ name: "lag age", points: t("lag_age_s") }]);
    chart($("chart-lag-offsets"), "offsets behind, all topics", "offsets", [{ name: "lag", points: t("lag_offsets") }]);
    var lat = run.latency || [], lw = lat[lat.length - 1] || {};
    $("sotw-e2e-p50").textContent = fmt(lw.p50, 0);
    $("sotw-e2e-p99").textContent = fmt(lw.p99, 0);
    var pts = function (k) { return lat.map(function (w) { return [w.t_ms / 1000, w[k]]; }); };
    chart($("chart-e2e"), "end-to-end latency by 5 s of commit time", "ms", [
      { name: "p50", points: pts("p50") }, { name: "p99", points: pts("p99") }, { name: "max", points: pts("max") }]);
    chart($("chart-rate"), "throughput", "msg/s", [
      { name: "produced", points: rates(samples, "sent") }, { name: "consumed", points: rates(samples, "consumed") }]);
    chart($("chart-batch"), "the pipeline's last batch", "ms", [{ name: "batch duration", points: t("batch_duration_ms") }]);

    var c = run.correctness || {};
    var badge = $("sotw-correct");
    badge.textContent = c.sessions_verified ? (c.passed ? "correct so far" : "NOT correct") : "nothing verified yet";
    badge.className = "badge " + (c.sessions_verified ? (c.passed ? "ok" : "bad") : "");
    var rows = [
      ["sessions closed by the simulators", c.sessions_closed], ["sessions verified", c.sessions_verified],
      ["exact / required", (c.sessions_exact || 0) + " / " + (c.sessions_exact_required || 0)],
      ["rows lost", c.rows_lost], ["rows repeated", c.rows_repeated], ["rows unexpected", c.rows_unexpected]];
    Object.keys(c.blame || {}).forEach(function (k) { rows.push(["blame: " + k, c.blame[k]]); });
    Object.keys(c.discrepancy_counts || {}).forEach(function (k) { rows.push([k.replace(/_/g, " "), c.discrepancy_counts[k]]); });
    $("sotw-correctness").innerHTML = rows.map(function (r) { return "<tr><td>" + r[0] + "</td><td>" + (typeof r[1] === "string" ? r[1] : fmt(r[1], 0)) + "</td></tr>"; }).join("");

    var now = s.faults_now || {}, injected = (s.fleet && s.fleet.faults) || {};
    var body = $("faults-table").querySelector("tbody");
    if (!body.children.length) {
      body.innerHTML = KINDS.map(function (k) {
        var counter = k === "abandon" ? "abandoned" : k;
        return "<tr><td>" + k + '</td><td><input type="number" min="0" max="1" step="0.001" id="fault-' + k + '"></td>' +
          '<td id="now-' + k + '">-</td><td id="injected-' + counter + '">-</td></tr>';
      }).join("");
      body.addEventListener("input", function () { edited = true; });
    }
    KINDS.forEach(function (k) {
      var base = now[k] !== undefined ? now[k] : s.profile.faults[k];
      if (!edited) $("fault-" + k).value = base;
      $("now-" + k).textContent = now[k] !== undefined ? fmt(now[k], 4) : "-";
      var counter = k === "abandon" ? "abandoned" : k;
      $("injected-" + counter).textContent = fmt(injected[counter] || 0, 0);
    });
    $("sotw-log").textContent = (s.log || []).slice(-30).join("\n");
    var kinds = $("incident-kind");
    if (!kinds.children.length) {
      Object.keys(s.incident_kinds).forEach(function (k) {
        var o = document.createElement("option"); o.value = k; o.textContent = k; kinds.appendChild(o);
      });
      kinds.addEventListener("change", function () { $("incident-params").value = JSON.stringify(state.incident_kinds[kinds.value]); });
      $("incident-params").value = JSON.stringify(s.incident_kinds[kinds.value]);
    }
  }

  function poll() {
    fetch("state", { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (s) { state = s; render(); })
      .catch(function () {})
      .finally(function () { setTimeout(poll, 1000); });
  }

  function post(url, body, message) {
    message.className = "message";
    message.textContent = "sending...";
    return fetch(url, { method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) })
      .then(function (r) { return r.json().then(function (j) { return [r.ok, j]; }); })
      .then(function (res) {
        message.className = "message" + (res[0] ? "" : " error");
        message.textContent = res[0] ? "sent" : res[1].message;
      })
      .catch(function (e) { message.className = "message error"; message.textContent = String(e); });
  }

  $("faults-form").addEventListener("submit", function (e) {
    e.preventDefault();
    var body = {};
    KINDS.forEach(function (k) { body[k] = Number($("fault-" + k).value); });
    post("faults", body, $("faults-message")).then(function () { edited = false; });
  });
  $("reset-faults").addEventListener("click", function () {
    edited = false;
    post("faults", state ? state.profile.faults : {}, $("faults-message"));
  });
  Array.prototype.forEach.call(document.querySelectorAll("[data-incident]"), function (b) {
    b.addEventListener("click", function () { post("incident", JSON.parse(b.getAttribute("data-incident")), $("incident-message")); });
  });
  $("incident-form").addEventListener("submit", function (e) {
    e.preventDefault();
    var params;
    try { params = JSON.parse($("incident-params").value || "{}"); } catch (err) {
      $("incident-message").className = "message error"; $("incident-message").textContent = "parameters must be JSON"; return;
    }
    params.kind = $("incident-kind").value;
    post("incident", params, $("incident-message"));
  });
  poll();
})();
