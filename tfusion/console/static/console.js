// tfusion console: keep the page's live part current without reloading, and copy commands.
// The server answers 204 when the part it would send is the one shown (same fingerprint).
(function () {
  "use strict";
  var live = document.getElementById("live");
  var updated = document.getElementById("updated");
  if (!live) { return; }
  var pollMs = parseInt(live.getAttribute("data-poll-ms"), 10) || 1000;
  var busy = false;

  function fragmentUrl() {
    var query = live.getAttribute("data-query");
    var params = new URLSearchParams(query || "");
    params.set("fragment", "1");
    params.set("since", live.getAttribute("data-etag") || "");
    return window.location.pathname + "?" + params.toString();
  }

  function refresh() {
    if (busy || document.hidden) { return; }
    // a reader choosing a filter or reading details keeps what they are looking at
    if (live.contains(document.activeElement) && document.activeElement !== document.body &&
        document.activeElement.tagName !== "A") { return; }
    busy = true;
    fetch(fragmentUrl(), { credentials: "same-origin", cache: "no-store" }).then(function (response) {
      if (response.status === 200) {
        var etag = response.headers.get("ETag") || "";
        return response.text().then(function (html) {
          live.innerHTML = html;
          live.setAttribute("data-etag", etag);
          if (updated) { updated.textContent = "Updated " + new Date().toLocaleTimeString(); }
        });
      }
      return null;
    }).catch(function () { /* the next tick tries again */ }).then(function () { busy = false; });
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest(".copy-button") : null;
    if (!button || !navigator.clipboard) { return; }
    navigator.clipboard.writeText(button.getAttribute("data-copy")).then(function () {
      button.textContent = "Copied";
    }, function () { button.textContent = "Select and copy"; });
  });

  window.setInterval(refresh, pollMs);
})();
