// Times in the viewer's own zone, with the zone's name ("30 Nov 2026, 23:05 CET"), and
// relative times that stay current ("just now", "3 minutes ago"). The server writes UTC as
// the fallback; nothing here comes from a CDN.
(() => {
  // (dateStyle/timeStyle cannot be combined with timeZoneName: the fields are named.)
  const absolute = new Intl.DateTimeFormat(undefined, {
    year: "numeric",
    month: "short",
    day: "numeric",
    hour: "2-digit",
    minute: "2-digit",
    timeZoneName: "short",
  });
  const relative = new Intl.RelativeTimeFormat("en", { numeric: "auto" });
  const units = [
    ["day", 86400],
    ["hour", 3600],
    ["minute", 60],
  ];

  function ago(date) {
    const seconds = Math.round((date.getTime() - Date.now()) / 1000);
    if (Math.abs(seconds) < 60) return "just now";
    for (const [unit, size] of units) {
      if (Math.abs(seconds) >= size) return relative.format(Math.trunc(seconds / size), unit);
    }
    return "just now";
  }

  function render(root) {
    for (const node of root.querySelectorAll("time[data-local], time[data-relative]")) {
      const date = new Date(node.getAttribute("datetime"));
      if (Number.isNaN(date.getTime())) continue;
      if (node.hasAttribute("data-local")) {
        node.textContent = absolute.format(date);
        node.title = Intl.DateTimeFormat().resolvedOptions().timeZone;
      } else {
        node.textContent = ago(date);
        node.title = absolute.format(date);
      }
    }
  }

  document.addEventListener("DOMContentLoaded", () => render(document));
  // Live regions are morphed back to the server's UTC text: write them again.
  document.addEventListener("htmx:afterSettle", (event) => render(event.target));
  setInterval(() => render(document), 30_000);
})();
