// Adds the sotw panel to Locust's own page: a button that opens /sotw/ beside Locust's tabs.
(function () {
  "use strict";
  var script = document.currentScript;
  var base = script ? script.src.replace(/\/sotw\/static\/button\.js.*$/, "") : "";
  var frame = document.createElement("iframe");
  frame.id = "sotw-frame";
  frame.title = "sotw panel";
  frame.src = base + "/sotw/";
  frame.style.cssText =
    "position:fixed;top:0;right:0;width:min(680px,100%);height:100%;border:0;" +
    "border-left:2px solid #4a6;background:#fff;z-index:1999;display:none;box-shadow:-4px 0 12px rgba(0,0,0,.2)";
  var button = document.createElement("button");
  button.id = "sotw-button";
  button.type = "button";
  button.textContent = "sotw: lag, latency, correctness, controls";
  button.style.cssText =
    "position:fixed;right:16px;bottom:16px;z-index:2000;padding:8px 14px;border-radius:18px;border:0;" +
    "background:#2e7d32;color:#fff;font:600 14px sans-serif;cursor:pointer;box-shadow:0 2px 6px rgba(0,0,0,.3)";
  button.addEventListener("click", function () {
    var open = frame.style.display !== "none";
    frame.style.display = open ? "none" : "block";
    button.textContent = open ? "sotw: lag, latency, correctness, controls" : "close the sotw panel";
  });
  document.body.appendChild(frame);
  document.body.appendChild(button);
})();
