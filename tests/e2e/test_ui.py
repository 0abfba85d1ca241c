"""What a person sees in MLflow's UI, in headless Chromium against `mlflow ui` on a throwaway
store that the real pipeline made (tiny random-init BERT: a short baseline, a long experiment
that takes `@champion`) plus a `wellfed-compare` run: the headline comes first on the runs
table (beside MLflow's assistant panel, which opens by itself on a first visit), its chart
view, the run page and the registered version's pages. Screenshots go to $WELLFED_UI_SHOTS
when set (to look at), else to the test's temporary folder.

Needs Debian's `chromium` and `chromium-driver` (`apt-get install -y chromium chromium-driver`)
and the `selenium` package; skipped in one line without them."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.e2e.pipeline import env, make_project, mlflow_runs, run
from tests.services import mlflow_served
from wellfed.track import champion, registry, runs_view, ui_links

pytestmark = pytest.mark.e2e

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
try:
    import selenium  # noqa: F401
except ImportError:
    selenium = None
if not (CHROMIUM and DRIVER and selenium):
    pytest.skip("no headless browser: apt-get install -y chromium chromium-driver and "
                "pip install selenium", allow_module_level=True)

NAME = "wellfed-classifier"
ROWS = {"train.tsv": 400, "dev.tsv": 100, "test.tsv": 100}
PARAMS = {"train": {"epochs": 6, "lr": 3e-3, "global_batch_size": 16, "micro_batch_size": 16,
                    "eval_every": 20, "report_every": 5, "checkpoint_every": 0, "max_steps": 3},
          "ray": {"num_workers": 1, "cpus_per_worker": 1}}
WINDOW = (1600, 1000)
"""A laptop-sized window; the assistant panel takes a quarter of it."""
PATIENCE = 240  # seconds a page may take to show its content on a loaded 2-core machine


def pipeline_runs(project: Path):
    """(client, the pipeline's runs oldest first): the comparison's run left out."""
    client, runs = mlflow_runs(project)
    return client, [r for r in runs if runs_view.COMPARISON not in r.data.tags]


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir):
    """A short baseline (version 1), a long experiment (version 2, @champion) and a
    comparison's own run."""
    dest = tmp_path_factory.mktemp("ui")
    make_project(dest, {**PARAMS, "model": {"name": str(tiny_model_dir), "init": "random"}}, ROWS)
    run(["dvc", "repro"], dest)
    run(["git", "add", "-A"], dest)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "run"], dest)
    run(["dvc", "exp", "run", "-S", "train.max_steps=0"], dest)
    client, runs = mlflow_runs(dest)
    comparison = client.create_run(runs[0].info.experiment_id, run_name="compare a vs b",
                                   tags={runs_view.COMPARISON: "seeds"}).info.run_id
    client.log_metric(comparison, "vs_seeds/accuracy_diff", 0.1)
    client.set_terminated(comparison)
    return dest


@pytest.fixture(scope="module")
def ui(project):
    """`mlflow ui` on the project's store, as `make ui` serves it (one worker here), stopped
    also when a test fails."""
    with mlflow_served("ui", ["--backend-store-uri", f"sqlite:///{project / 'mlflow.db'}",
                              "--workers", "1"], project, env(), PATIENCE) as base:
        yield base


@pytest.fixture()
def browser():
    """Headless Chromium with a fresh profile (each test is a first visit), quit also on a
    failure."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="wellfed-chromium-")
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(arg)
    os.environ.setdefault("SE_AVOID_STATS", "true")  # Selenium Manager: no usage report
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("WELLFED_UI_SHOTS") or tmp_path_factory.mktemp("shots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def shown(driver, route: str, text: str, shots: Path, name: str, exact: bool = True):
    """Open `route` and wait until an element whose own text is `text` (or, not `exact`,
    holds it) is on screen; save a screenshot; return that element."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(route)
    xpath = (f"//*[text()[normalize-space(.) = {xpath_literal(text)}]]" if exact else
             f"//*[text()[contains(normalize-space(.), {xpath_literal(text)})]]")
    try:
        found = WebDriverWait(driver, PATIENCE, poll_frequency=0.5).until(
            lambda d: [e for e in d.find_elements(By.XPATH, xpath) if e.is_displayed()])
    finally:
        driver.save_screenshot(str(shots / f"{name}.png"))
    return found[0]


def xpath_literal(text: str) -> str:
    return f"'{text}'" if "'" not in text else "concat('" + text.replace("'", "',\"'\",'") + "')"


def panel_left(driver) -> float:
    """Where MLflow's assistant panel begins (px from the left), or the window's width when it
    is closed."""
    from selenium.webdriver.common.by import By

    panels = [e for e in driver.find_elements(By.CSS_SELECTOR, "[data-assistant-ui='true']")
              if e.is_displayed() and e.size["width"] > 200]
    return min((e.location["x"] for e in panels), default=float(WINDOW[0]))


def close_assistant(driver) -> None:
    """Close the assistant panel as docs/mlflow.md says (its Close button, once per browser)."""
    from selenium.webdriver.common.by import By

    for button in driver.find_elements(By.CSS_SELECTOR,
                                       "[data-assistant-ui='true'] button[aria-label='Close']"):
        if button.is_displayed():
            button.click()


def texts(driver, css: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, css) if e.text]


def test_the_headline_view_shows_the_ranked_figure_and_the_alias_beside_the_assistant(
        ui, browser, project, shots):
    """A first visit: MLflow opens its assistant over the right quarter of the window; the
    ranked figure and the alias come right after the run's name, left of it; best first; the
    comparison's run is filtered out, the filter in the search box."""
    from selenium.webdriver.common.by import By

    _, runs = pipeline_runs(project)
    best = max(runs, key=lambda r: r.data.metrics.get("eval/macro_f1", -1))
    shown(browser, ui_links.experiment(ui, runs[0].info.experiment_id, runs_view.KEY),
          best.info.run_name, shots, "headline-view")  # the rows are in
    header, alias = (browser.find_element(By.XPATH, f"//*[normalize-space(text())='{text}']")
                     for text in ("eval/macro_f1", "wellfed.alias"))
    edge = panel_left(browser)
    assert edge < WINDOW[0], "the assistant panel no longer opens on a first visit: fix the docs"
    for cell in (header, alias):  # on screen, left of the panel
        assert 0 < cell.location["x"] and cell.location["x"] + cell.size["width"] <= edge
    names = [n for n in texts(browser, "a") if n in {r.info.run_name for r in runs}
             or n == "compare a vs b"]
    assert len(runs) == 2 and names == [best.info.run_name,
                                        *(r.info.run_name for r in runs if r is not best)]
    assert "@champion" in texts(browser, "body")[0]
    search = browser.find_element(By.CSS_SELECTOR, "input[placeholder]")
    assert search.get_attribute("value") == runs_view.NOT_COMPARISONS


def test_the_chart_view_opens_on_the_headline(ui, browser, project, shots):
    from selenium.webdriver.common.by import By

    _, runs = pipeline_runs(project)
    route = (ui_links.experiment(ui, runs[0].info.experiment_id, runs_view.KEY)
             + "&compareRunsMode=CHART")
    section = shown(browser, route, f"{runs_view.NAME}: eval/macro_f1", shots, "chart-view")
    titles = [e.text for e in browser.find_elements(By.XPATH, "//*[normalize-space(text())]")
              if e.is_displayed() and e.location["y"] > section.location["y"]
              and e.text.startswith(("eval/", "train/", "best/", "val/", "time/", "workers/"))]
    assert titles[:2] == ["eval/macro_f1", "eval/accuracy"], titles[:5]


def test_the_compare_page_starts_on_the_first_metric_the_runs_logged(ui, browser, project,
                                                                    shots):
    """MLflow's own Compare page (select runs, Compare) plots the first metric both runs
    logged, train/loss: it cannot be told otherwise, so docs/mlflow.md says where to pick
    eval/macro_f1 (and that the headline view's chart view leads with it)."""
    from selenium.webdriver.common.by import By

    _, runs = pipeline_runs(project)
    ids = ",".join(f"%22{r.info.run_id}%22" for r in runs)
    label = shown(browser, f"{ui}/#/compare-runs?runs=[{ids}]&experiments=[%22"
                  f"{runs[0].info.experiment_id}%22]&{ui_links.VIEW}", "Metrics:", shots,
                  "compare-page")
    assert label.find_element(By.XPATH, "following-sibling::*[1]").text == "train/loss"


def test_the_run_page_leads_with_the_note_once_the_assistant_is_closed(ui, browser, project,
                                                                      shots):
    """With the panel open (a first visit, 1600 px) the page stacks its details, datasets and
    tags above the description; closed, it keeps them in a sidebar and the description, the
    headline first, leads. The metrics table lists metrics in the order they were first
    logged (eval/* last), as docs/mlflow.md says."""
    from selenium.webdriver.common.by import By

    _, runs = pipeline_runs(project)
    best = max(runs, key=lambda r: r.data.metrics.get("eval/macro_f1", -1))
    page = ui_links.run(ui, best.info.experiment_id, best.info.run_id)
    shown(browser, page, "Description", shots, "run-page-first-visit")
    close_assistant(browser)
    described = shown(browser, page, "Description", shots, "run-page")
    assert panel_left(browser) == WINDOW[0]  # closed, and remembered across a reload
    about = browser.find_element(By.XPATH, "//*[normalize-space(text())='About this run']")
    assert described.location["x"] < about.location["x"]  # the details are the sidebar
    assert described.location["y"] <= about.location["y"] + 5
    figure = f"eval/macro_f1 {best.data.metrics['eval/macro_f1']:.4f}"
    headline = browser.find_element(By.XPATH, f"//*[text()[contains(., {xpath_literal(figure)})]]")
    assert headline.location["y"] < described.location["y"] + 60  # the note's first line
    listed = [t for t in texts(browser, "a") if t in best.data.metrics]
    assert listed.index("train/loss") < listed.index("eval/macro_f1")
    shown_tags = [k for k in best.data.tags if not k.startswith("mlflow.")]
    assert not [k for k in shown_tags if k.startswith(("version.", "calibration."))]
    # a few chips above the description: tests/e2e/test_run_page.py says which and why
    assert "git.commit" not in shown_tags and len(shown_tags) <= 8, sorted(shown_tags)


def test_the_version_pages_carry_the_reason(ui, browser, project, shots):
    from selenium.webdriver.common.by import By

    client, _ = pipeline_runs(project)
    holder = client.get_model_version_by_alias(NAME, "champion")
    reason = holder.tags[registry.REASON]
    described = champion.description(champion.scored(holder), reason, "champion")
    assert holder.description == described
    shown(browser, ui_links.model_version(ui, NAME, holder.version), described, shots,
          "version-page", exact=False)
    assert not browser.find_elements(By.CSS_SELECTOR, "a[href*='github.com']")
    shown(browser, f"{ui}/#/models/{NAME}?{ui_links.VIEW}", "Version 1", shots, "versions-list")
    listed = texts(browser, "body")[0]  # the list cuts each description to its first words:
    # the figure first (then the recipe), for the holder and for the others
    figure = f"\nmacro_f1 {float(holder.tags[registry.VALUE]):.4f}"
    assert figure in listed and "\nmacro_f1 " in listed.replace(figure, "", 1), listed
