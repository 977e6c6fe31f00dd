// rllm viewer: keyboard paging and search focus; everything else is plain HTML from the server.
(function () {
  document.addEventListener("keydown", function (event) {
    if (event.target && /^(INPUT|TEXTAREA)$/.test(event.target.tagName)) return;
    if (event.key === "/") {
      var search = document.getElementById("search");
      if (search) { event.preventDefault(); search.focus(); }
    } else if (event.key === "ArrowLeft" || event.key === "ArrowRight") {
      var link = document.querySelector(event.key === "ArrowLeft" ? "a[rel=prev]" : "a[rel=next]");
      if (link) window.location = link.href;
    }
  });
  // Trained tokens: a count next to each sample's heading, read from the marked spans.
  document.querySelectorAll(".sample").forEach(function (sample) {
    var trained = sample.querySelectorAll(".response .tok-trained").length;
    sample.setAttribute("data-trained", String(trained));
  });
})();
