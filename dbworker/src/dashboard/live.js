// Live updates for the dashboard: while the tab is visible, re-fetch this
// page every few seconds and swap in its <main>; stop while it is hidden.
// With `?refresh=N` it reloads the page every N seconds instead (the meta
// tag that does it without script is in <noscript>). Either waits while a
// form on the page is being filled in: a field focused, or edited and left.
// The only script the dashboard serves (same origin, under its CSP); with
// scripts blocked every page is as served, and reloads if asked to.
(function () {
  "use strict";
  var main = document.querySelector("main");
  if (!main) {
    return;
  }
  function focused() {
    var active = document.activeElement;
    return active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
  }
  function changed(field, boxes) {
    // Whether the operator changed the field from the value it was served with.
    var type = (field.getAttribute("type") || "").toLowerCase();
    if (/^(hidden|submit|button|reset|image)$/.test(type)) {
      return false;
    }
    if (type === "checkbox") {
      return boxes && field.checked !== field.defaultChecked;
    }
    if (type === "radio") {
      return field.checked !== field.defaultChecked;
    }
    if (field.tagName === "SELECT") {
      var options = field.options;
      var served = options.length ? 0 : -1;
      for (var i = 0; i < options.length; i++) {
        if (options[i].defaultSelected) {
          served = i;
        }
        if (field.multiple && options[i].selected !== options[i].defaultSelected) {
          return true;
        }
      }
      return !field.multiple && field.selectedIndex !== served;
    }
    return field.value !== field.defaultValue;
  }
  function held(boxes) {
    // A form being filled in, focused or not. A live update carries the
    // checkboxes through (`boxes` false); a reload would lose them too.
    if (focused()) {
      return true;
    }
    var fields = main.querySelectorAll("input, select, textarea");
    for (var i = 0; i < fields.length; i++) {
      if (changed(fields[i], boxes)) {
        return true;
      }
    }
    return false;
  }
  function say(holding) {
    // The refresh bar says the page waits for the form.
    var note = document.getElementById("refresh-held");
    if (note) {
      note.hidden = !holding;
    }
  }
  var reload = parseInt(main.getAttribute("data-reload"), 10);
  if (reload > 0) {
    setInterval(function () {
      var holding = held(true);
      say(holding);
      if (!holding) {
        location.reload();
      }
    }, reload * 1000);
    return;
  }
  if (!main.hasAttribute("data-live") || !window.fetch || !window.DOMParser) {
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
    if (document.hidden || busy) {
      return;
    }
    var holding = held(false);
    say(holding);
    if (holding) {
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
        if (fresh && !held(false)) {
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
