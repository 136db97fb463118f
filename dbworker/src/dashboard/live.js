// Live updates for the dashboard: while the tab is visible, re-fetch this
// page every few seconds and swap in its <main>; stop while it is hidden.
// The only script the dashboard serves (same origin, under its CSP); with
// scripts blocked every page is as served, and reloads if asked to.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  if (!main || !window.fetch || !window.DOMParser) {
    return;
  }
  var every = (parseInt(main.getAttribute("data-live"), 10) || 5) * 1000;
  var timer = null;
  var busy = false;
  function mark() {
    // The refresh bar says the page is live.
    var note = document.getElementById("live-note");
    var off = document.getElementById("live-off");
    if (note) {
      note.hidden = false;
    }
    if (off) {
      off.hidden = true;
    }
  }
  mark();
  function typing() {
    // Never replace a form the operator is filling in.
    var active = document.activeElement;
    return active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
  }
  function boxes() {
    // Each checkbox's state by name and value (the jobs the operator picked).
    var state = {};
    var all = main.querySelectorAll("input[type=checkbox]");
    for (var i = 0; i < all.length; i++) {
      state[all[i].name + "=" + all[i].value] = all[i].checked;
    }
    return state;
  }
  function restore(state) {
    // An update must not undo a selection: boxes still listed keep theirs.
    var all = main.querySelectorAll("input[type=checkbox]");
    for (var i = 0; i < all.length; i++) {
      var key = all[i].name + "=" + all[i].value;
      if (Object.prototype.hasOwnProperty.call(state, key)) {
        all[i].checked = state[key];
      }
    }
  }
  function tick() {
    if (document.hidden || busy || typing()) {
      return;
    }
    busy = true;
    fetch(location.href, { credentials: "same-origin", headers: { "X-Dashboard-Live": "1" } })
      .then(function (response) {
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (!html) {
          return;
        }
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main[data-live]");
        if (fresh && !typing()) {
          var picked = boxes();
          main.innerHTML = fresh.innerHTML;
          restore(picked);
          mark();
          document.body.setAttribute("data-live-updated", String(Date.now()));
        }
      })
      .catch(function () {})
      .then(function () {
        busy = false;
      });
  }
  function start() {
    if (!timer) {
      timer = setInterval(tick, every);
    }
  }
  function stop() {
    if (timer) {
      clearInterval(timer);
      timer = null;
    }
  }
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      stop();
    } else {
      tick();
      start();
    }
  });
  if (!document.hidden) {
    start();
  }
})();
