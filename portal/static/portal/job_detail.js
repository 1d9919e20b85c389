// The job page. Each poll replaces the status card (partials/job_status.html): keep its state
// history open once the reader opened it.
(function () {
  let historyOpen = false;
  document.addEventListener("toggle", function (e) {
    if (e.target.closest && e.target.closest("#job-status")) historyOpen = e.target.open;
  }, true);
  document.addEventListener("htmx:load", function (e) {
    const details = e.target.id === "job-status" && e.target.querySelector("details");
    if (details && historyOpen) details.open = true;
  });
})();
