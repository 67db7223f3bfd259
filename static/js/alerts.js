// Alerts pages, without inline script (the Content Security Policy allows none). Both pages work without it.
//
// The alerts list: tick every alert at once, and keep ticked alerts ticked. The "current" section refreshes
// itself every few seconds; a refresh swaps in new rows and would untick them, so it waits while any alert is
// ticked (a click on Refresh or a bulk action still goes through).
(function () {
  function ticked(region) {
    return region ? region.querySelectorAll('input[type=checkbox][name="ids"]:checked').length : 0;
  }

  function showPaused(region) {
    var note = region && region.querySelector("[data-bulk-paused]");
    if (note) note.hidden = ticked(region) === 0;
  }

  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.matches) return;
    var region = box.closest("#alert-current");
    if (!region) return;
    if (box.matches("input[data-bulk-all]")) {
      region.querySelectorAll('input[type=checkbox][name="ids"]').forEach(function (row) {
        row.checked = box.checked;
      });
    }
    if (box.matches("input[data-bulk-all], input[name=ids]")) showPaused(region);
  });

  document.addEventListener("htmx:beforeRequest", function (event) {
    var config = event.detail.requestConfig;
    if (!config || config.triggeringEvent) return;  // a click or a submit: always sent
    var target = event.detail.target;
    if (target && target.id === "alert-current" && ticked(target) > 0) event.preventDefault();
  });

  function revealTickAll() {
    document.querySelectorAll("input[data-bulk-all][hidden]").forEach(function (box) { box.hidden = false; });
  }
  document.addEventListener("htmx:load", revealTickAll);
  document.addEventListener("DOMContentLoaded", revealTickAll);
})();

// The rule form: show only the fields that matter for the chosen kind. Each field carries the kinds it applies
// to in data-kinds; the server ignores the others anyway, so without this script every field shows, labelled
// with the kinds it applies to.
// On a new rule, a field the user has not changed takes the chosen kind's default.
(function () {
  function setUp() {
    var form = document.querySelector("form[data-rule-form]");
    if (!form) return;
    var kind = form.querySelector("select[name=kind]");
    var defaultsNode = document.getElementById("rule-kind-defaults");
    var defaults = defaultsNode ? JSON.parse(defaultsNode.textContent) : {};
    var current = kind.value;
    form.classList.add("js");

    function show() {
      form.querySelectorAll("[data-kinds]").forEach(function (node) {
        node.hidden = node.dataset.kinds.split(" ").indexOf(kind.value) < 0;
        // A hidden field is not sent (the server would ignore it anyway).
        node.querySelectorAll("input, select, textarea").forEach(function (field) { field.disabled = node.hidden; });
      });
    }

    function applyDefaults(previous, next) {
      var before = defaults[previous] || {};
      var after = defaults[next] || {};
      Object.keys(after).forEach(function (name) {
        var field = form.elements[name];
        if (field && (field.value === "" || field.value === before[name])) field.value = after[name];
      });
    }

    kind.addEventListener("change", function () {
      if ("new" in form.dataset) applyDefaults(current, kind.value);
      current = kind.value;
      show();
    });
    show();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUp);
  else setUp();
})();
