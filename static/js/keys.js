// The reviewer's keyboard, and the inbox's selection for bulk decisions.
//
// Inbox: j / k move the selection (the row is focused, so Enter opens it as a link would),
// o opens it, x ticks it for a bulk decision, a / r open it ready to approve / reject.
// One approval: a approves (or, when the action asks for a typed answer, goes to its first
// field), r opens the rejection and goes to the reason. ? shows the keys anywhere.
// Nothing fires while typing in a field, or with Ctrl, Alt or Cmd held.
(function () {
  "use strict";

  var TEXT_INPUTS = /^(text|search|email|url|tel|password|number|date|datetime-local|time|month|week)$/;
  function typing(el) {
    if (!el) { return false; }
    if (el.isContentEditable || el.tagName === "TEXTAREA" || el.tagName === "SELECT") { return true; }
    return el.tagName === "INPUT" && TEXT_INPUTS.test(el.type || "text");
  }

  function rowList() { return Array.prototype.slice.call(document.querySelectorAll("#inbox-rows > tr")); }

  function currentRow() {
    var rows = rowList();
    for (var i = 0; i < rows.length; i++) {
      if (rows[i].contains(document.activeElement)) { return rows[i]; }
    }
    for (var j = 0; j < rows.length; j++) {
      if (rows[j].classList.contains("current")) { return rows[j]; }
    }
    return null;
  }

  function select(row) {
    var rows = rowList();
    for (var i = 0; i < rows.length; i++) { rows[i].classList.remove("current"); }
    if (!row) { return; }
    row.classList.add("current");
    var link = row.querySelector("a.message");
    if (link) { link.focus(); }
    row.scrollIntoView({block: "nearest"});
  }

  function move(step) {
    var rows = rowList();
    if (!rows.length) { return; }
    var at = rows.indexOf(currentRow());
    var to = at < 0 ? (step > 0 ? 0 : rows.length - 1) : Math.min(rows.length - 1, Math.max(0, at + step));
    select(rows[to]);
  }

  function open(row, hash) {
    var link = row && row.querySelector("a.message");
    if (link) { window.location.href = link.href + (hash || ""); }
  }

  // Bulk selection: the count of ticked rows, ranges with Shift, and "select all".
  var lastTicked = null;
  function boxes() { return Array.prototype.slice.call(document.querySelectorAll("#inbox-rows input[name=ids]")); }
  function showSelected() {
    var said = document.getElementById("bulk-selected");
    if (!said) { return; }
    var all = document.getElementById("select-all");
    var count = document.getElementById("select-all-count");
    var ticked = boxes().filter(function (box) { return box.checked; }).length;
    said.textContent = all && all.checked ? "All " + (count ? count.textContent : "") + " selected" :
      ticked ? ticked + " selected" : "";
  }
  function tick(box, on) {
    box.checked = on;
    var all = document.getElementById("select-all");
    if (all && !on) { all.checked = false; }
  }

  document.addEventListener("click", function (evt) {
    var box = evt.target;
    if (!box || box.name !== "ids" || !box.closest("#inbox-rows")) { return; }
    var list = boxes();
    if (evt.shiftKey && lastTicked && list.indexOf(lastTicked) >= 0) {
      var from = list.indexOf(lastTicked);
      var to = list.indexOf(box);
      var step = from < to ? 1 : -1;
      for (var i = from; i !== to; i += step) { tick(list[i], box.checked); }
    }
    tick(box, box.checked);
    lastTicked = box;
    showSelected();
  });
  document.addEventListener("change", function (evt) {
    if (evt.target && evt.target.id === "select-all") {
      var on = evt.target.checked;
      boxes().forEach(function (box) { box.checked = on; });
      showSelected();
    }
  });

  // A refetched list keeps what was ticked and which row was selected.
  var kept = null;
  document.addEventListener("htmx:beforeSwap", function (evt) {
    if (!evt.detail.target || evt.detail.target.id !== "inbox") { return; }
    var row = currentRow();
    var all = document.getElementById("select-all");
    kept = {
      ids: boxes().filter(function (box) { return box.checked; }).map(function (box) { return box.value; }),
      all: !!(all && all.checked),
      current: row ? row.id : null,
      focused: !!(row && row.contains(document.activeElement)),
    };
  });
  // A comment posted: the discussion comes back with an empty form, and the focus goes back to
  // it, so the next words typed are text, not keys (an "a" would approve).
  document.addEventListener("htmx:afterSwap", function (evt) {
    var target = evt.detail.target;
    if (!target || !target.id || target.id.indexOf("comments-") !== 0) { return; }
    var box = document.getElementById(target.id);
    var field = box ? box.querySelector("textarea") : null;
    if (field) { field.focus(); }
  });
  document.addEventListener("htmx:afterSwap", function (evt) {
    if (!kept || !document.getElementById("inbox")) { return; }
    var was = kept;
    kept = null;
    var all = document.getElementById("select-all");
    if (all) { all.checked = was.all; }
    boxes().forEach(function (box) { box.checked = was.all || was.ids.indexOf(box.value) >= 0; });
    var row = was.current ? document.getElementById(was.current) : null;
    if (row) {
      row.classList.add("current");
      if (was.focused) { var link = row.querySelector("a.message"); if (link) { link.focus(); } }
    }
    showSelected();
    void evt;
  });

  // Editing a tool call's arguments ticks "run the call with these arguments": an approval
  // without a tick runs the call as the model proposed it, whatever the fields hold.
  document.addEventListener("input", function (evt) {
    var area = evt.target && evt.target.closest ? evt.target.closest("details.edit-call") : null;
    if (!area || evt.target.name === "edit") { return; }
    var tick = area.querySelector("input[name=edit]");
    if (tick) { tick.checked = true; }
  });

  // One approval's page.
  function approveForm() { return document.querySelector("form.approve-form"); }
  function readyToApprove(submit) {
    var form = approveForm();
    if (!form) { return false; }
    if (form.dataset.typed === "true") {
      var field = form.querySelector("input:not([type=hidden]), textarea, select");
      if (field) { field.focus(); }
      return true;
    }
    var button = form.querySelector("button.approve");
    if (!button) { return false; }
    // One key approves only where there is one thing to approve; a run's page with several
    // paused calls goes to the first one's button instead (Enter then approves it).
    var only = document.querySelectorAll("form.approve-form").length === 1;
    if (submit && only) { button.click(); } else { button.focus(); }
    return true;
  }
  function readyToReject() {
    var details = document.querySelector("details.reject");
    if (!details) { return false; }
    details.open = true;
    var reason = details.querySelector("textarea");
    if (reason) { reason.focus(); }
    return true;
  }

  function help() {
    var dialog = document.getElementById("keys-help");
    if (!dialog) { return; }
    if (dialog.open) { dialog.close(); } else { dialog.showModal(); }
  }

  document.addEventListener("keydown", function (evt) {
    if (evt.defaultPrevented || evt.ctrlKey || evt.metaKey || evt.altKey || typing(evt.target)) { return; }
    var dialog = document.getElementById("keys-help");
    if (dialog && dialog.open && evt.key !== "?") { return; }
    var inInbox = !!document.getElementById("inbox-rows");
    var handled = true;
    switch (evt.key) {
      case "?": help(); break;
      case "j": if (inInbox) { move(1); } else { handled = false; } break;
      case "k": if (inInbox) { move(-1); } else { handled = false; } break;
      case "o":
      case "Enter":
        // Enter on a link or a button does what it does; elsewhere it opens the selected row.
        if (inInbox && currentRow() && !(evt.key === "Enter" && evt.target.closest("a, button, summary"))) {
          open(currentRow());
        } else { handled = false; }
        break;
      case "x":
        var row = inInbox && currentRow();
        var box = row && row.querySelector("input[name=ids]");
        if (box) { box.click(); } else { handled = false; }
        break;
      case "a":
        if (inInbox) { if (currentRow()) { open(currentRow(), "#approve"); } else { handled = false; } }
        else { handled = readyToApprove(true); }
        break;
      case "r":
        if (inInbox) { if (currentRow()) { open(currentRow(), "#reject"); } else { handled = false; } }
        else { handled = readyToReject(); }
        break;
      default: handled = false;
    }
    if (handled) { evt.preventDefault(); }
  });

  document.addEventListener("DOMContentLoaded", function () {
    // Opened from the inbox with a or r: ready to decide, nothing decided yet.
    if (window.location.hash === "#approve") { readyToApprove(false); }
    if (window.location.hash === "#reject") { readyToReject(); }
    showSelected();
  });
})();
