// opod console and members' portal: form posts with the session's CSRF token, fetch-and-swap of a page's rows, live updates over
// server-sent events, and the dark/light toggle. No library; every page works as plain HTML links and forms
// for reading, and this script adds the changes and the in-place updates.
(function () {
  "use strict";
  var FRAGMENT = "X-Console-Fragment";
  var THEME_KEY = "opod-theme";
  var root = document.documentElement;

  function csrf() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  function say(text, bad) {
    var status = document.getElementById("status");
    if (!status) return;
    status.textContent = text;
    status.classList.toggle("error", !!bad);
  }

  // --- theme ---------------------------------------------------------------------------------
  function applyTheme(theme) {
    if (theme) root.setAttribute("data-theme", theme);
    else root.removeAttribute("data-theme");
    var dark = theme ? theme === "dark" : window.matchMedia("(prefers-color-scheme: dark)").matches;
    document.querySelectorAll("[data-theme-toggle]").forEach(function (b) {
      b.setAttribute("aria-pressed", dark ? "true" : "false");
      b.textContent = dark ? "Light theme" : "Dark theme";
    });
  }
  var stored = null;
  try { stored = localStorage.getItem(THEME_KEY); } catch (e) { stored = null; }
  applyTheme(stored);

  // --- fetch-and-swap ------------------------------------------------------------------------
  function swap(url, block, push) {
    var target = document.getElementById(block);
    if (!target) { window.location.href = url; return Promise.resolve(); }
    target.setAttribute("aria-busy", "true");
    return fetch(url, { headers: { [FRAGMENT]: block }, credentials: "same-origin" })
      .then(function (r) {
        if (r.redirected) { window.location.href = r.url; return null; }
        return r.text().then(function (html) { return { ok: r.ok, html: html }; });
      })
      .then(function (got) {
        if (!got) return;
        if (!got.ok) { window.location.href = url; return; }
        target.innerHTML = got.html;
        if (push) history.pushState({ block: block }, "", url);
      })
      .catch(function () { say("The leader did not answer; try again.", true); })
      .finally(function () { target.removeAttribute("aria-busy"); });
  }

  function queryOf(form) {
    var params = new URLSearchParams();
    new FormData(form).forEach(function (value, key) { if (value !== "") params.append(key, value); });
    var text = params.toString();
    return form.getAttribute("action").split("?")[0] + (text ? "?" + text : "");
  }

  window.addEventListener("popstate", function (e) {
    if (e.state && e.state.block) swap(window.location.href, e.state.block, false);
  });

  // --- posts ---------------------------------------------------------------------------------
  function fieldsOf(form) {
    var out = {};
    new FormData(form).forEach(function (value, key) { if (key !== "csrf") out[key] = String(value); });
    return out;
  }

  function showDiff(lines) {
    var pre = document.getElementById("diff");
    if (!pre) return;
    pre.textContent = "";
    if (!lines.length) { pre.textContent = "No difference."; return; }
    lines.forEach(function (pair) {
      var span = document.createElement("span");
      span.className = "d-" + pair[0];
      span.textContent = pair[1] + "\n";
      pre.appendChild(span);
    });
  }

  // A new key's secret, shown once in the page's #secret box (never kept by the page past its reload).
  function reveal(secret) {
    var box = document.getElementById("secret");
    if (!box) return;
    box.querySelector("code").textContent = secret;
    box.hidden = false;
    box.focus();
  }

  function post(form, submitter) {
    var url = (submitter && submitter.getAttribute("formaction")) || form.getAttribute("action");
    var confirmText = form.getAttribute("data-confirm");
    if (confirmText && !window.confirm(confirmText)) return;
    var buttons = form.querySelectorAll("button");
    buttons.forEach(function (b) { b.disabled = true; });
    say("Working…");
    fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf() },
      body: JSON.stringify(fieldsOf(form)),
    })
      .then(function (r) { return r.json().then(function (body) { return { ok: r.ok, body: body }; }); })
      .then(function (got) {
        if (!got.ok) { say(got.body.error || "Refused.", true); return; }
        say(got.body.message || "Done.");
        if (got.body.location) { window.location.href = got.body.location; return; }
        if (got.body.diff) showDiff(got.body.diff);
        if (got.body.secret) reveal(got.body.secret);
        if (form.hasAttribute("data-settings") && got.body.version) {
          window.location.href = window.location.pathname;
          return;
        }
        if (got.body.refresh && document.getElementById(got.body.refresh)) {
          swap(window.location.href, got.body.refresh, false);
        }
      })
      .catch(function () { say("The leader did not answer; nothing is known to have changed. Try again.", true); })
      .finally(function () { buttons.forEach(function (b) { b.disabled = false; }); });
  }

  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (form.hasAttribute("data-post")) {
      e.preventDefault();
      post(form, e.submitter);
    } else if (form.hasAttribute("data-swap")) {
      e.preventDefault();
      swap(queryOf(form), form.getAttribute("data-swap"), true);
    }
  });

  document.addEventListener("click", function (e) {
    var toggle = e.target.closest("[data-theme-toggle]");
    if (toggle) {
      var dark = toggle.getAttribute("aria-pressed") === "true";
      var next = dark ? "light" : "dark";
      try { localStorage.setItem(THEME_KEY, next); } catch (err) { /* private mode: this page only */ }
      applyTheme(next);
      return;
    }
    var link = e.target.closest("a[data-swap]");
    if (link && !e.ctrlKey && !e.metaKey && !e.shiftKey) {
      e.preventDefault();
      swap(link.getAttribute("href"), link.getAttribute("data-swap"), true);
    }
  });

  // --- live parts ----------------------------------------------------------------------------
  document.querySelectorAll("[data-refresh]").forEach(function (el) {
    var seconds = Number(el.getAttribute("data-refresh")) || 10;
    window.setInterval(function () {
      if (document.visibilityState === "visible") swap(window.location.href, el.id, false);
    }, seconds * 1000);
  });

  document.querySelectorAll("[data-stream]").forEach(function (el) {
    if (!window.EventSource) return;
    var source = new EventSource(el.getAttribute("data-stream"));
    source.addEventListener(el.getAttribute("data-stream-event") || "replicas", function (e) {
      el.innerHTML = e.data;
      el.setAttribute("data-updated", new Date().toISOString());
    });
    // The work ended: nothing more will change, so the browser is not to open the stream again.
    source.addEventListener("end", function () { source.close(); el.setAttribute("data-ended", "true"); });
    window.addEventListener("pagehide", function () { source.close(); });
  });
})();
