// The operation page: a refused control's reason stays above the progress until the next action or until the
// operator dismisses it here (without JavaScript, its Dismiss link reloads the page, which shows no reason).
document.addEventListener("click", function (event) {
  var link = event.target.closest && event.target.closest("[data-dismiss]");
  if (!link) return;
  event.preventDefault();
  var box = link.closest(".error-box");
  if (box) box.remove();
});
