// The cost report's charts (templates/accounting/reports.html): data from its json_script.
document.addEventListener("DOMContentLoaded", function () {
  if (!window.Chart) return;
  const d = JSON.parse(document.getElementById("report-chart-data").textContent);
  // One colour per team across every chart; fixed-height boxes so the charts line up.
  const palette = ["#2456c9", "#e07b39", "#1f9e89", "#b23a8a", "#7a8a1f", "#5b6475", "#c9a224", "#3a9bd9"];
  const teamColour = {};
  [...d.teams.map(t => t.label), ...d.share.labels].forEach(l => { if (!(l in teamColour)) teamColour[l] = palette[Object.keys(teamColour).length % palette.length]; });
  const common = {responsive: true, maintainAspectRatio: false};
  new Chart(document.getElementById("chart-usage"), {
    type: "bar",
    data: {labels: d.months, datasets: d.teams.map(t => ({label: t.label, data: t.data, backgroundColor: teamColour[t.label]}))},
    options: {...common, scales: {x: {stacked: true}, y: {stacked: true, title: {display: true, text: "GPU-hours"}}}}
  });
  new Chart(document.getElementById("chart-share"), {
    type: "doughnut",
    data: {labels: d.share.labels, datasets: [{data: d.share.data, backgroundColor: d.share.labels.map(l => teamColour[l])}]},
    options: common
  });
  new Chart(document.getElementById("chart-util"), {
    type: "bar",
    data: {labels: d.utilisation.labels, datasets: [{label: "utilisation %", data: d.utilisation.data, backgroundColor: "#1f9e89"}]},
    options: {...common, scales: {y: {min: 0, max: 100}}}
  });
});
