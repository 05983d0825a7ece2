// The console's own behaviour: copy buttons. Everything else is plain HTML forms and htmx.
"use strict";
document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-copy-from]");
  if (!button) return;
  const source = document.getElementById(button.dataset.copyFrom);
  if (!source) return;
  const text = source.value !== undefined ? source.value : source.textContent;
  try {
    await navigator.clipboard.writeText(text.trim());
    button.textContent = "Copied";
  } catch (err) {
    // No clipboard permission: select the text so Ctrl-C copies it.
    if (source.select) source.select();
    button.textContent = "Select and copy";
  }
});
