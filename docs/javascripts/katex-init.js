// Renders the formulas that pymdownx.arithmatex (generic mode) leaves as \( … \) and \[ … \]
// with KaTeX, shipped with the site (javascripts/vendor/katex-*): no CDN, so formulas render
// offline and from file:// too. Material's document$ fires on every page load.
document$.subscribe(function () {
  document.querySelectorAll(".arithmatex").forEach(function (el) {
    renderMathInElement(el, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  });
});
