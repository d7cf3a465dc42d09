// Live pages. The server pushes two kinds of frame over the websocket:
//
// - Inbox changes (they carry "seq"): an interrupt entered, changed in or left the inboxes of
//   the teams in "before"/"after", with its row rendered once for everyone ("html") and its
//   number in each of those teams' streams. The inbox applies them itself (below); it fetches
//   its list again only on (re)connect, when a number shows a frame was missed, or to refill.
// - Hints about runs. Run and interrupt pages refetch their fragment, with
//   hx-trigger="grundlag:interrupt-9 from:body, ...": every frame fires `grundlag:changed` on
//   <body>, and, by what it names, `grundlag:interrupt-<id>`, `grundlag:run-<id>` or
//   `grundlag:hello`. Event names, not htmx's filter expressions: those are evaluated as code,
//   which the Content-Security-Policy forbids. Fragments carry hx-sync="this:replace": pushes
//   come in bursts (decided, running, completed), and a refetch queued behind one in flight
//   would be lost when that one swaps its element out.
(function () {
  "use strict";
  function setLive(state, text) {
    var el = document.getElementById("live");
    if (el) { el.dataset.state = state; el.textContent = text; }
  }

  // The inbox list. Its section says what it shows as of which numbers: data-seq (each of the
  // user's teams' stream numbers), data-count (all pending in view, not only the rows listed),
  // data-teams, data-filter-team, data-filter-action, data-limit.
  var inbox = {
    last: null,      // team id -> the stream number the list is as of
    count: 0,
    loading: false,  // a fetch is in flight: frames wait for it in `held`
    held: [],
    early: [],       // frames whose predecessors have not arrived yet
    gapTimer: null,
  };

  function section() { return document.getElementById("inbox"); }

  function adopt(el) {
    // A list just rendered by the server: its numbers, its count; then the frames that came
    // meanwhile, those it does not already reflect.
    try { inbox.last = JSON.parse(el.dataset.seq || "{}"); } catch (e) { inbox.last = {}; }
    inbox.count = parseInt(el.dataset.count || "0", 10);
    inbox.loading = false;
    retryMs = 1000;
    var held = inbox.held.concat(inbox.early);
    inbox.held = [];
    inbox.early = [];
    showCount(el);
    for (var i = 0; i < held.length; i++) { accept(el, held[i]); }
  }

  function refetch(el) {
    inbox.loading = true;
    htmx.trigger(el, "grundlag:refetch");
  }

  function inView(el, teams, action) {
    var mine = (el.dataset.teams || "").split(",");
    var only = el.dataset.filterTeam;
    var wanted = el.dataset.filterAction;
    if (wanted && action !== wanted) { return false; }
    for (var i = 0; i < teams.length; i++) {
      var team = String(teams[i]);
      if (mine.indexOf(team) >= 0 && (!only || only === team)) { return true; }
    }
    return false;
  }

  function rows() { return document.getElementById("inbox-rows"); }

  function insertRow(el, html) {
    var template = document.createElement("template");
    template.innerHTML = html;
    var row = template.content.firstElementChild;
    if (!row) { return; }
    var body = rows();
    var old = document.getElementById(row.id);
    localTimes(row);
    if (old) {
      // The same row again (changed): it stays ticked, selected and focused if it was.
      var wasBox = old.querySelector("input[name=ids]");
      var box = row.querySelector("input[name=ids]");
      if (wasBox && box) { box.checked = wasBox.checked; }
      if (old.classList.contains("current")) { row.classList.add("current"); }
      var focused = old.contains(document.activeElement);
      old.replaceWith(row);
      htmx.process(row);
      if (focused) { var link = row.querySelector("a.message"); if (link) { link.focus(); } }
      return;
    }
    var limit = parseInt(el.dataset.limit || "200", 10);
    // Newest first: before the first row older than it.
    var next = null;
    for (var child = body.firstElementChild; child; child = child.nextElementSibling) {
      if (child.dataset.order < row.dataset.order) { next = child; break; }
    }
    if (!next && body.children.length >= limit) { return; } // beyond the rows listed; counted only
    body.insertBefore(row, next);
    htmx.process(row);
    if (body.children.length > limit) { body.lastElementChild.remove(); }
  }

  function showCount(el) {
    var listed = rows() ? rows().children.length : 0;
    var count = document.getElementById("inbox-count");
    if (count) { count.textContent = String(inbox.count); }
    var shown = document.getElementById("inbox-shown");
    if (shown) {
      shown.hidden = inbox.count <= listed;
      shown.querySelector("span").textContent = String(listed);
    }
    var table = el.querySelector("table.inbox");
    var empty = el.querySelector(".empty");
    if (table) { table.hidden = listed === 0; }
    var bar = document.getElementById("bulk");
    if (bar) { bar.hidden = listed === 0; }
    var all = document.getElementById("select-all-count");
    if (all) { all.textContent = String(inbox.count); }
    // A row that arrives while "select all" is ticked is ticked too: the preview lists them.
    var everything = document.getElementById("select-all");
    if (everything && everything.checked) {
      var boxes = document.querySelectorAll("#inbox-rows input[name=ids]");
      for (var b = 0; b < boxes.length; b++) { boxes[b].checked = true; }
    }
    if (empty) { empty.hidden = listed !== 0 || inbox.count !== 0; }
    document.title = "(" + inbox.count + ") " + (el.dataset.title || document.title);
  }

  // Where a frame stands against the list: "old" (reflected already), "next" (each of the
  // user's streams it is in moves on by one), or "early" (a number in between has not come).
  function standing(el, frame) {
    var mine = (el.dataset.teams || "").split(",");
    var next = false;
    for (var team in frame.seq) {
      if (!Object.prototype.hasOwnProperty.call(frame.seq, team) || mine.indexOf(team) < 0) { continue; }
      var have = inbox.last[team] || 0;
      var n = frame.seq[team];
      if (n <= have) { continue; }
      if (n !== have + 1) { return "early"; }
      next = true;
    }
    return next ? "next" : "old";
  }

  // Numbers follow the commits, but frames from different threads or processes may overtake
  // each other: an early frame waits a moment for the ones before it; if they do not come (one
  // was lost), the list is fetched again, a little later on each page so they do not all ask
  // at once.
  var GAP_WAIT_MS = 400;

  function accept(el, frame) {
    if (inbox.last === null) { adopt(el); }
    if (inbox.loading) { inbox.held.push(frame); return; }
    inbox.early.push(frame);
    var progress = true;
    while (progress) {
      progress = false;
      for (var i = 0; i < inbox.early.length; i++) {
        var state = standing(el, inbox.early[i]);
        if (state === "early") { continue; }
        var ready = inbox.early.splice(i, 1)[0];
        if (state === "next") { apply(el, ready); }
        progress = true;
        break;
      }
    }
    if (inbox.early.length && !inbox.gapTimer) {
      inbox.gapTimer = setTimeout(function () {
        inbox.gapTimer = null;
        if (inbox.early.length) { inbox.early = []; refetch(el); }
      }, GAP_WAIT_MS + Math.random() * GAP_WAIT_MS);
    }
  }

  // Now and then the server says where the streams are. A list still behind them a moment later
  // (a frame may be on its way) lost a frame that nothing after it would have shown: fetched
  // again.
  function behind(el, streams) {
    if (inbox.last === null) { return false; }
    var mine = (el.dataset.teams || "").split(",");
    for (var team in streams) {
      if (Object.prototype.hasOwnProperty.call(streams, team) && mine.indexOf(team) >= 0 &&
          streams[team] > (inbox.last[team] || 0)) { return true; }
    }
    return false;
  }

  function checkStreams(el, streams) {
    if (!behind(el, streams)) { return; }
    setTimeout(function () {
      if (!inbox.loading && behind(el, streams)) { refetch(section() || el); }
    }, GAP_WAIT_MS * 2);
  }

  function apply(el, frame) {
    var mine = (el.dataset.teams || "").split(",");
    for (var team in frame.seq) {
      if (Object.prototype.hasOwnProperty.call(frame.seq, team) && mine.indexOf(team) >= 0) {
        inbox.last[team] = Math.max(inbox.last[team] || 0, frame.seq[team]);
      }
    }
    var was = inView(el, frame.before, frame.action);
    var is = inView(el, frame.after, frame.action);
    if (was && !is) {
      var gone = document.getElementById("interrupt-" + frame.interrupt_id);
      if (gone) { gone.remove(); }
      inbox.count = Math.max(0, inbox.count - 1);
    } else if (is && frame.html) {
      insertRow(el, frame.html);
      if (!was) {
        inbox.count += 1;
        announce(frame.interrupt_id);
        say(frame.interrupt_id);
      }
    }
    showCount(el);
    // Rows were decided away from a longer list: fetch the next ones before it runs dry.
    var listed = rows().children.length;
    var limit = parseInt(el.dataset.limit || "200", 10);
    if (inbox.count > listed && listed < limit / 2) { refetch(el); }
  }

  // Times in the reader's time zone: a <time data-local> is written in UTC by the server
  // (actions' "when" filter); here its text becomes local ("datetime", "time"), or only its
  // title does ("title": an age such as "3 min"), the absolute time on hover either way.
  var LONG = {year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"};
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function localTimes(root) {
    var times = (root || document).querySelectorAll("time[data-local]");
    for (var i = 0; i < times.length; i++) {
      var el = times[i];
      var at = new Date(el.getAttribute("datetime"));
      if (isNaN(at.getTime())) { continue; }
      el.title = at.toLocaleString(undefined, LONG);
      var part = el.getAttribute("data-local");
      var hm = pad(at.getHours()) + ":" + pad(at.getMinutes());
      if (part === "time") { el.textContent = hm; }
      if (part === "datetime") {
        el.textContent = at.getFullYear() + "-" + pad(at.getMonth() + 1) + "-" + pad(at.getDate()) + " " + hm;
      }
    }
  }

  // Browser notifications, opted into per browser (the Notifications page, or the inbox's
  // button): a new approval while this tab is in the background shows one; clicking it opens
  // the approval here.
  var NOTIFY_KEY = "grundlag-browser-notifications";
  function notifying() {
    return "Notification" in window && Notification.permission === "granted" &&
      window.localStorage.getItem(NOTIFY_KEY) === "on";
  }
  function announce(interruptId) {
    if (!document.hidden || !notifying()) { return; }
    var row = document.getElementById("interrupt-" + interruptId);
    var link = row ? row.querySelector("a.message") : null;
    if (!link) { return; }
    var note = new Notification("New approval (" + inbox.count + " waiting)", {
      body: link.textContent.trim(), tag: "grundlag-interrupt-" + interruptId
    });
    note.onclick = function () { window.focus(); window.location.href = link.href; note.close(); };
  }
  // Screen readers hear each new approval (a polite live region, outside the list so a refetch
  // does not read the whole list out).
  function say(interruptId) {
    var region = document.getElementById("inbox-announce");
    var row = document.getElementById("interrupt-" + interruptId);
    var link = row ? row.querySelector("a.message") : null;
    if (!region || !link) { return; }
    region.textContent = "New approval: " + link.textContent.trim() + " " + inbox.count + " waiting.";
  }
  function showNotifyState(button) {
    var said = document.getElementById(button.id + "-state");
    var on = notifying();
    button.hidden = !("Notification" in window) || Notification.permission === "denied";
    button.textContent = on ? "Turn off notifications" : "Turn on notifications";
    button.setAttribute("aria-pressed", on ? "true" : "false");
    if (said) {
      said.textContent = !("Notification" in window) ? "This browser cannot show notifications." :
        Notification.permission === "denied" ? "Blocked in this browser's site settings." :
        on ? "On in this browser." : "Off in this browser.";
    }
  }
  function setUpNotifyButton(button) {
    showNotifyState(button);
    button.addEventListener("click", function () {
      if (notifying()) {
        window.localStorage.removeItem(NOTIFY_KEY);
        showNotifyState(button);
        return;
      }
      Notification.requestPermission().then(function (permission) {
        if (permission === "granted") { window.localStorage.setItem(NOTIFY_KEY, "on"); }
        showNotifyState(button);
      });
    });
  }

  // A fetch of the list that failed is tried again, later each time, up to half a minute.
  var retryMs = 1000;
  function fetchFailed(evt) {
    var target = evt.detail.target;
    if (!target || target.id !== "inbox") { return; }
    inbox.loading = false;
    inbox.held = [];
    var el = section();
    if (!el) { return; }
    setTimeout(function () { refetch(section() || el); }, retryMs);
    retryMs = Math.min(retryMs * 2, 30000);
  }

  document.addEventListener("htmx:wsBeforeMessage", function (evt) {
    evt.preventDefault(); // frames are JSON, applied here, not HTML for htmx to swap
    var detail = {};
    try { detail = JSON.parse(evt.detail.message); } catch (e) { return; }
    var el = section();
    if (el && detail.event === "hello") { refetch(el); }
    if (el && detail.seq) { accept(el, detail); }
    if (el && detail.event === "stream") { checkStreams(el, detail.streams || {}); }
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
  document.addEventListener("DOMContentLoaded", function () {
    var el = section();
    if (el) { adopt(el); }
    localTimes(document);
    var button = document.getElementById("browser-notifications");
    if (button) { setUpNotifyButton(button); }
  });
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
    fetchFailed(evt);
  });
  document.addEventListener("htmx:sendError", function (evt) {
    flash("The server cannot be reached. Nothing was changed; please try again.");
    fetchFailed(evt);
  });
  document.addEventListener("htmx:timeout", fetchFailed);
  document.addEventListener("htmx:sendAbort", fetchFailed);
  document.addEventListener("htmx:afterRequest", function (evt) {
    if (evt.detail.successful) { flash(""); }
  });
  document.addEventListener("htmx:beforeRequest", function (evt) {
    var target = evt.detail.target;
    if (target && target.id === "inbox") { inbox.loading = true; }
  });
  document.addEventListener("htmx:afterSettle", function (evt) { localTimes(evt.detail.elt); });
  document.addEventListener("htmx:afterSwap", function (evt) {
    var el = section();
    if (el && evt.detail.target && (evt.detail.target === el || evt.detail.target.id === "inbox")) {
      adopt(el);
      return;
    }
    var title = evt.detail.elt && evt.detail.elt.dataset ? evt.detail.elt.dataset.title : null;
    if (title) { document.title = title; }
  });
})();
