// Pushes from the server are hints. Every frame (and every (re)connect, which the server
// greets with "hello") fires `grundlag:changed` on <body>, and, by what it names,
// `grundlag:interrupt-<id>`, `grundlag:run-<id>` or `grundlag:hello`; the page's fragments
// refetch themselves with hx-trigger="grundlag:interrupt-9 from:body, ...". Event names, not
// htmx's filter expressions: those are evaluated as code, which the Content-Security-Policy
// forbids. Fragments carry
// hx-sync="this:replace": pushes come in bursts (decided, running, completed), and a refetch
// queued behind one in flight would be lost when that one swaps its element out.
(function () {
  "use strict";
  function setLive(state, text) {
    var el = document.getElementById("live");
    if (el) { el.dataset.state = state; el.textContent = text; }
  }
  document.addEventListener("htmx:wsBeforeMessage", function (evt) {
    evt.preventDefault(); // frames are JSON hints, not HTML to swap
    var detail = {};
    try { detail = JSON.parse(evt.detail.message); } catch (e) { return; }
    htmx.trigger(document.body, "grundlag:changed", detail);
    if (detail.event === "hello") { htmx.trigger(document.body, "grundlag:hello", detail); }
    if (detail.interrupt_id) { htmx.trigger(document.body, "grundlag:interrupt-" + detail.interrupt_id, detail); }
    if (detail.run_id) { htmx.trigger(document.body, "grundlag:run-" + detail.run_id, detail); }
  });
  document.addEventListener("htmx:wsOpen", function (evt) {
    setLive("live", "live");
    // A run page also wants its run's status changes, which inboxes do without.
    var run = document.body.dataset.watchRun;
    if (run) { evt.detail.socketWrapper.send(JSON.stringify({watch_run: parseInt(run, 10)})); }
  });
  document.addEventListener("htmx:wsClose", function () { setLive("reconnecting", "reconnecting…"); });
  // htmx does not swap error responses; say what went wrong instead of doing nothing.
  function flash(text) {
    var el = document.getElementById("flash");
    if (!el) { return; }
    el.textContent = text;
    el.hidden = !text;
  }
  document.addEventListener("htmx:responseError", function (evt) {
    var xhr = evt.detail.xhr;
    var body = xhr.getResponseHeader("Content-Type") === "text/plain" ? xhr.responseText : "";
    flash(body || "The server answered " + xhr.status + ". Nothing was changed; please try again.");
  });
  document.addEventListener("htmx:sendError", function () {
    flash("The server cannot be reached. Nothing was changed; please try again.");
  });
  document.addEventListener("htmx:afterRequest", function (evt) {
    if (evt.detail.successful) { flash(""); }
  });
  document.addEventListener("htmx:afterSwap", function (evt) {
    var title = evt.detail.elt && evt.detail.elt.dataset ? evt.detail.elt.dataset.title : null;
    if (!title) {
      var inbox = document.getElementById("inbox");
      title = inbox ? inbox.dataset.title : null;
    }
    if (title) { document.title = title; }
  });
})();
