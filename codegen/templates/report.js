(function () {
  "use strict";
  var tl = document.getElementById("timeline");
  var inner = document.getElementById("tl-inner");
  function choose(group, button) {
    var all = document.querySelectorAll("[data-group='" + group + "']");
    for (var i = 0; i < all.length; i++) { all[i].classList.remove("on"); }
    button.classList.add("on");
  }
  document.querySelectorAll("[data-zoom]").forEach(function (b) {
    b.addEventListener("click", function () {
      inner.style.width = (100 * Number(b.getAttribute("data-zoom"))) + "%";
      choose("zoom", b);
    });
  });
  document.querySelectorAll("[data-colour]").forEach(function (b) {
    b.addEventListener("click", function () {
      tl.classList.toggle("by-layer", b.getAttribute("data-colour") === "layer");
      choose("colour", b);
    });
  });
  document.querySelectorAll("table[data-sortable] th.sortable").forEach(function (th) {
    th.addEventListener("click", function () {
      var table = th.closest("table"), body = table.tBodies[0];
      var col = Array.prototype.indexOf.call(th.parentNode.children, th);
      var down = th.getAttribute("data-dir") !== "down";
      th.setAttribute("data-dir", down ? "down" : "up");
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[col].getAttribute("data-v"), y = b.cells[col].getAttribute("data-v");
        var nx = Number(x), ny = Number(y);
        var c = (isNaN(nx) || isNaN(ny)) ? String(x).localeCompare(String(y)) : nx - ny;
        return down ? -c : c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
})();
