// The budget page's burn-down chart (templates/accounting/budget.html): data from its json_script.
document.addEventListener("DOMContentLoaded", function () {
  if (!window.Chart) return;
  const d = JSON.parse(document.getElementById("budget-chart-data").textContent);
  new Chart(document.getElementById("chart-burndown"), {
    type: "line",
    data: {labels: d.labels, datasets: [
      {label: "GPU-hours left", data: d.remaining, spanGaps: false},
      {label: "ideal", data: d.ideal, borderDash: [6, 4], pointRadius: 0}
    ]},
    options: {scales: {y: {title: {display: true, text: "GPU-hours"}}}}
  });
});
