// The first page follows new messages: it reloads itself unless a filter has focus.
setInterval(function () {
  var active = document.activeElement;
  if (!(active && active.closest && active.closest("form.filters"))) {
    location.reload();
  }
}, 5000);
