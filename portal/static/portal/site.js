// Every page: the menu button of narrow screens, and a confirmation before destructive actions.
// (A static file, not inline script: the Content-Security-Policy allows scripts from 'self' only.)
(function () {
  document.documentElement.classList.add("js");

  // <button class="menu-toggle"> opens and closes the main menu (shown only at phone width, site.css).
  document.addEventListener("click", function (e) {
    const button = e.target.closest && e.target.closest(".menu-toggle");
    if (!button) return;
    const header = button.closest("header");
    const open = !header.classList.contains("menu-open");
    header.classList.toggle("menu-open", open);
    button.setAttribute("aria-expanded", open ? "true" : "false");
  });

  // <form data-confirm="Cancel job x?">: asks first; "Cancel" in the dialog leaves everything as it was.
  document.addEventListener("submit", function (e) {
    const form = e.target;
    const message = form.getAttribute && form.getAttribute("data-confirm");
    if (message && !window.confirm(message)) {
      e.preventDefault();
      e.stopImmediatePropagation();
    }
  }, true);
})();
