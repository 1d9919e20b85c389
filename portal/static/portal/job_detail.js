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

// The GPU charts (partials/job_gpu_usage.html: points are server-side means over equal buckets),
// drawn at load and again each time the section's poll (every GPU_USAGE_SYNC_SECONDS while the
// job runs, one request for all its GPUs) swaps in fresh data.
(function () {
  function draw(root) {
    const data = root.querySelector && root.querySelector("#gpu-chart-data");
    if (!data || !window.Chart) return;
    const d = JSON.parse(data.textContent);
    const labels = d.labels.map(function (t) { return new Date(t).toLocaleTimeString(); });
    function chart(id, key, max) {
      const canvas = root.querySelector("#" + id);
      if (!canvas) return;
      const old = window.Chart.getChart(canvas);
      if (old) old.destroy();
      new window.Chart(canvas, {
        type: "line",
        data: {labels: labels, datasets: d.series.map(function (s) { return {label: s.label, data: s[key], pointRadius: 0, spanGaps: false}; })},
        options: {animation: false, maintainAspectRatio: false, scales: {y: {min: 0, max: max}}}
      });
    }
    chart("chart-gpu-util", "util", 100);
    chart("chart-gpu-mem", "mem_mib", undefined);
  }
  document.addEventListener("DOMContentLoaded", function () { draw(document); });
  document.addEventListener("htmx:load", function (e) {
    if (e.target.id === "gpu-usage") draw(e.target);
  });
})();
