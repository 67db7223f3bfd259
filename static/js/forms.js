// Small behaviours of forms, without inline script (the Content Security Policy allows none):
// - a form with data-confirm asks before it is sent;
// - a form with data-autosubmit is sent when one of its selects, checkboxes or radio buttons changes (htmx then
//   swaps the results); its text fields are sent with Enter, as in any form, not at every key;
document.addEventListener("submit", function (event) {
  var message = event.target.dataset && event.target.dataset.confirm;
  if (message && !window.confirm(message)) event.preventDefault();
});
document.addEventListener("change", function (event) {
  var field = event.target;
  var choice = field.tagName === "SELECT" || (field.tagName === "INPUT" && /^(checkbox|radio)$/.test(field.type));
  if (!choice || !field.form || !("autosubmit" in field.form.dataset)) return;
  field.form.requestSubmit();
});
// - such a form leaves its empty fields out of the address it requests (and pushes to the history): the address
//   names only the filters in use, short enough to read, share and bookmark;
document.addEventListener("htmx:configRequest", function (event) {
  var form = event.detail.elt;
  if (!form.dataset || !("autosubmit" in form.dataset) || event.detail.verb !== "get") return;
  var data = event.detail.formData;
  var empty = [];
  data.forEach(function (value, name) {
    if (data.getAll(name).every(function (item) { return item === ""; })) empty.push(name);
  });
  empty.forEach(function (name) { data.delete(name); });
});
// - a <details data-fold-on-phone> (a filter panel) starts folded on a narrow screen, where it would push the
//   results below the fold; it is open without JavaScript and on wider screens (a phone turned sideways too).
(function () {
  var phone = window.matchMedia("(max-width: 640px)");
  function fit() {
    document.querySelectorAll("details[data-fold-on-phone]").forEach(function (panel) { panel.open = !phone.matches; });
  }
  document.addEventListener("DOMContentLoaded", function () { if (phone.matches) fit(); });
  phone.addEventListener("change", fit);
})();
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
// - a form with data-max-bytes is not sent when its text fields hold more than that many bytes (UTF-8): the
//   server would refuse the whole request before the page could say why, and the edit would be lost. The
//   element [data-size-error] in the form says how large it is instead.
document.addEventListener("submit", function (event) {
  var form = event.target;
  var limit = form.dataset && Number(form.dataset.maxBytes);
  if (!limit || event.defaultPrevented) return;
  var size = 0;
  form.querySelectorAll("textarea, input[type=text], input:not([type])").forEach(function (field) {
    size += new Blob([field.value]).size;
  });
  var box = form.querySelector("[data-size-error]");
  if (size <= limit) {
    if (box) box.hidden = true;
    return;
  }
  event.preventDefault();
  if (box) {
    var amount = function (bytes) {
      return bytes >= 1048576 ? (bytes / 1048576).toFixed(1) + " MB" : Math.round(bytes / 1024) + " KB";
    };
    box.textContent = "The edited copy is " + amount(size) + ", more than the " + amount(limit) +
      " the console takes in a form; nothing was sent. Shorten it, or retry the message unchanged.";
    box.hidden = false;
    box.scrollIntoView({block: "center"});
  }
});
// - a control sent by htmx that the server refuses (a form whose token expired, a role the user lacks, a server
//   error) or that never reaches it: htmx swaps nothing on an error, so the click would seem to do nothing. The
//   flash area says what happened, in the error page's own words when it has some. Refreshes that run by
//   themselves stay quiet (the next one tries again).
(function () {
  function tell(text) {
    var flash = document.getElementById("flash");
    if (!flash) return;
    var box = document.createElement("p");
    box.className = "error-box";
    box.setAttribute("role", "alert");
    box.textContent = text;
    flash.replaceChildren(box);
    flash.scrollIntoView({block: "nearest"});
  }
  function clicked(event) {
    var config = event.detail.requestConfig;
    return Boolean(config && config.triggeringEvent);
  }
  document.addEventListener("htmx:responseError", function (event) {
    if (!clicked(event)) return;
    var xhr = event.detail.xhr;
    var page = new DOMParser().parseFromString(xhr.responseText || "", "text/html");
    var said = page.querySelector("main .card p");
    var reason = said ? said.textContent.trim() : "";
    tell(reason || "The console refused this (HTTP " + xhr.status + "). Reload the page to see what was done.");
  });
  document.addEventListener("htmx:sendError", function (event) {
    if (!clicked(event)) return;
    tell("The console could not be reached, so this was not sent. Check the connection and try again.");
  });
})();
