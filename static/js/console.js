// A form is sent once: a double click on "Approve" must not send a second decision that then
// comes back as an error after the person's own success. The clicked button says "Sending…".
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (!(form instanceof HTMLFormElement) || form.method.toLowerCase() !== "post") return;
  if (form.dataset.sending) {
    event.preventDefault();
    return;
  }
  form.dataset.sending = "true";
  const clicked = event.submitter;
  // Disable after this event: the browser has already read the clicked button's formaction.
  setTimeout(() => {
    for (const button of form.querySelectorAll("button")) button.disabled = true;
    if (clicked) clicked.textContent = "Sending…";
  });
});
// Coming back with the browser's Back button shows the page as it was: let it send again.
window.addEventListener("pageshow", () => {
  for (const form of document.querySelectorAll("form[data-sending]")) {
    delete form.dataset.sending;
    for (const button of form.querySelectorAll("button")) button.disabled = false;
  }
});
