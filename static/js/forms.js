// Small behaviours of forms, without inline script (the Content Security Policy allows none):
// - a form with data-confirm asks before it is sent;
// - a form with data-autosubmit is sent when one of its selects changes (htmx then swaps the results);
document.addEventListener("submit", function (event) {
  var message = event.target.dataset && event.target.dataset.confirm;
  if (message && !window.confirm(message)) event.preventDefault();
});
document.addEventListener("change", function (event) {
  var field = event.target;
  if (field.tagName !== "SELECT" || !field.form || !("autosubmit" in field.form.dataset)) return;
  field.form.requestSubmit();
});
// - a region that refreshes itself (hx-trigger="every ...") is not refreshed while someone is choosing in one of
//   its fields: the swap would reset their choice (a silence duration picked a second before).
document.addEventListener("htmx:beforeRequest", function (event) {
  var config = event.detail.requestConfig;
  if (!config || config.triggeringEvent) return;  // a click, a submit, a change: always sent
  var target = event.detail.target;
  var active = document.activeElement;
  if (target && active && target.contains(active) && /^(SELECT|INPUT|TEXTAREA)$/.test(active.tagName)) {
    event.preventDefault();
  }
});
