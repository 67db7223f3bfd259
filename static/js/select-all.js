// Tick or untick every row checkbox on the page; the checkbox only appears when scripts run.
document.addEventListener("change", function (event) {
  var box = event.target;
  if (!box.matches || !box.matches("input[data-select-all]")) return;
  var form = box.closest("form");
  form.querySelectorAll('input[type=checkbox][name="' + box.dataset.selectAll + '"]').forEach(function (row) {
    row.checked = box.checked;
  });
});
document.addEventListener("htmx:load", reveal);
document.addEventListener("DOMContentLoaded", reveal);
function reveal() {
  document.querySelectorAll("input[data-select-all][hidden]").forEach(function (box) { box.hidden = false; });
}
