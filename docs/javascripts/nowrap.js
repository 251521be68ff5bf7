// Marks table cells that hold a number, or "mean ± sd" (the results tables), so that the
// stylesheet keeps each on one line (docs/stylesheets/extra.css: td.mmpe-number).
(function () {
  var number = /^\s*(\*\*)?[-+−]?[\d.,]+(e[-+]?\d+)?\s*(±\s*[\d.,]+(e[-+]?\d+)?)?\s*[×x%]?\s*(\*\*)?\s*$/i;
  function mark() {
    document.querySelectorAll(".md-typeset td").forEach(function (td) {
      if (number.test(td.textContent) || td.textContent.indexOf(" ± ") >= 0) {
        td.classList.add("mmpe-number");
      }
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", mark);
  } else {
    mark();
  }
})();
