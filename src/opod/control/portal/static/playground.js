// opod portal's playground: a chat streamed from /v1/chat/completions (server-sent events read with fetch and a
// stream reader) and an embedding from /v1/embeddings, with the key pasted in the page. The key is read from its
// field for each call and sent only to /v1 on this same address; nothing keeps it.
(function () {
  "use strict";
  var root = document.querySelector("[data-playground]");
  if (!root) return;
  var v1 = root.getAttribute("data-v1");

  function say(text, bad) {
    var status = document.getElementById("status");
    if (!status) return;
    status.textContent = text;
    status.classList.toggle("error", !!bad);
  }

  function key() {
    var field = document.getElementById("pg-key");
    return field ? field.value.trim() : "";
  }

  function call(path, body) {
    return fetch(v1 + path, {
      method: "POST",
      credentials: "omit",
      headers: { "Content-Type": "application/json", "Authorization": "Bearer " + key() },
      body: JSON.stringify(body),
    }).then(function (r) {
      if (r.ok) return r;
      return r.text().then(function (text) {
        var why = text;
        try {
          var parsed = JSON.parse(text);
          why = (parsed.error && (parsed.error.message || parsed.error)) || text;
        } catch (e) { /* not JSON: the text as it came */ }
        throw new Error(r.status + ": " + why);
      });
    });
  }

  // --- chat, streamed ----------------------------------------------------------------------------
  function streamInto(response, out) {
    var reader = response.body.getReader();
    var decoder = new TextDecoder();
    var pending = "";
    var chunks = 0;
    function line(text) {
      if (text.indexOf("data:") !== 0) return;
      var data = text.slice(5).trim();
      if (data === "[DONE]" || !data) return;
      var event = JSON.parse(data);
      var choice = event.choices && event.choices[0];
      var piece = choice && choice.delta && choice.delta.content;
      if (piece) {
        out.textContent += piece;
        chunks += 1;
        out.setAttribute("data-chunks", String(chunks));
      }
    }
    function pump() {
      return reader.read().then(function (got) {
        if (got.done) { if (pending) line(pending); return chunks; }
        pending += decoder.decode(got.value, { stream: true });
        var lines = pending.split("\n");
        pending = lines.pop();
        lines.forEach(function (l) { line(l.replace(/\r$/, "")); });
        return pump();
      });
    }
    return pump();
  }

  var chat = document.getElementById("pg-chat");
  if (chat) chat.addEventListener("submit", function (e) {
    e.preventDefault();
    if (!key()) { say("Paste a key first.", true); document.getElementById("pg-key").focus(); return; }
    var form = new FormData(chat);
    var out = document.getElementById("pg-answer");
    var button = chat.querySelector("button");
    out.textContent = "";
    out.removeAttribute("data-done");
    out.setAttribute("aria-busy", "true");
    button.disabled = true;
    say("Asking " + form.get("model") + "…");
    call("/chat/completions", {
      model: form.get("model"),
      messages: [{ role: "user", content: String(form.get("message")) }],
      max_tokens: Number(form.get("max_tokens")) || 64,
      stream: true,
    })
      .then(function (r) { return streamInto(r, out); })
      .then(function (chunks) { say("Answered in " + chunks + " streamed pieces."); out.setAttribute("data-done", "true"); })
      .catch(function (err) { say("Refused: " + err.message, true); })
      .finally(function () { out.removeAttribute("aria-busy"); button.disabled = false; });
  });

  // --- embeddings --------------------------------------------------------------------------------
  var embed = document.getElementById("pg-embed");
  if (embed) embed.addEventListener("submit", function (e) {
    e.preventDefault();
    if (!key()) { say("Paste a key first.", true); document.getElementById("pg-key").focus(); return; }
    var form = new FormData(embed);
    var out = document.getElementById("pg-vector");
    out.textContent = "";
    call("/embeddings", { model: form.get("model"), input: String(form.get("input")) })
      .then(function (r) { return r.json(); })
      .then(function (body) {
        var vector = body.data[0].embedding;
        out.textContent = vector.length + " dimensions: [" +
          vector.slice(0, 8).map(function (v) { return v.toFixed(4); }).join(", ") + ", …]";
        say("Embedded.");
      })
      .catch(function (err) { say("Refused: " + err.message, true); });
  });

  // --- the snippets follow the models chosen -----------------------------------------------------
  document.querySelectorAll("select[data-snippet-model]").forEach(function (select) {
    select.addEventListener("change", function () {
      var which = select.getAttribute("data-snippet-model");
      document.querySelectorAll('[data-model-of="' + which + '"]').forEach(function (span) {
        span.textContent = select.value;
      });
    });
  });
})();
