// The theme, set before the page is drawn (a classic script, not a module): the system's
// (prefers-color-scheme), unless the toggle chose the other one (kept in localStorage).
(function () {
  "use strict";
  const KEY = "cancel-bus-theme";
  const root = document.documentElement;
  const system = matchMedia("(prefers-color-scheme: light)");

  function chosen() {
    try {
      return localStorage.getItem(KEY);
    } catch (error) {
      return null;
    }
  }

  function choose(theme) {
    try {
      if (theme) localStorage.setItem(KEY, theme);
      else localStorage.removeItem(KEY);
    } catch (error) {
      // storage refused: the choice lasts as long as the page
    }
    apply(theme);
  }

  function systemTheme() {
    return system.matches ? "light" : "dark";
  }

  function apply(theme) {
    if (theme === "light" || theme === "dark") root.dataset.theme = theme;
    else delete root.dataset.theme;
    const button = document.getElementById("theme-toggle");
    if (button) {
      const light = (root.dataset.theme || systemTheme()) === "light";
      button.setAttribute("aria-pressed", String(light));
      button.title = (light ? "light" : "dark") + " theme, " +
        (root.dataset.theme ? "chosen here" : "as the system's") + "; press for the " +
        (light ? "dark" : "light") + " one";
    }
  }

  apply(chosen());
  document.addEventListener("DOMContentLoaded", () => {
    apply(chosen());
    document.getElementById("theme-toggle").addEventListener("click", () => {
      const light = (root.dataset.theme || systemTheme()) === "light";
      const next = light ? "dark" : "light";
      choose(next === systemTheme() ? null : next); // the system's again: no choice kept
    });
  });
  system.addEventListener("change", () => apply(chosen()));
})();
