"""The MLflow UI in a real browser: a store holding a residual-audit sweep and a gauntlet sweep is
served by `mlflow server`; headless Chromium (Debian's package, driven through chromedriver)
opens the experiment's runs table and the compare view of each sweep's runs, and the gate checks
and statistics are read back from the rendered DOM and checked against what the client reports.
Screenshots are saved under test-artifacts/ui/ (VLAEVAL_TEST_ARTIFACTS moves it)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest
from mlflow.tracking import MlflowClient

from helpers.configs import AUDIT_SMALL, REPO
from helpers.processes import run_main, sqlite_uri
from helpers.runs import sweep_of
from helpers.servers import CHROMEDRIVER, CHROMIUM, MlflowServer, need

pytestmark = pytest.mark.slow

SCREENSHOTS = Path(os.environ.get("VLAEVAL_TEST_ARTIFACTS", REPO / "test-artifacts")) / "ui"
# The probe's flags: without the background-networking ones Chromium keeps dialling Google's hosts,
# which this closed network refuses.
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=3000,1200",
]
AUDIT_STATISTICS = ["repeatability.spearman", "proposal.information_to_baseline_ratio"]


def _shown_as(text: str, value: float) -> bool:
    """Does the UI's text show `value`, to the digits it prints?"""
    text = text.strip().replace(",", "")
    if text.lower() == "nan":
        return math.isnan(value)
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    scale = 10.0 ** int(exponent or 0)
    return abs(float(text) - value) <= 0.51 * 10.0**-decimals * scale + 1e-12 * abs(value)


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory, migrated_store):
    """Two real sweeps (audit: iid vs sobol; gauntlet: no effect vs a planted catastrophe) in one
    SQLite store, served by `mlflow server` on 127.0.0.1."""
    root = tmp_path_factory.mktemp("ui-store")
    shutil.copy(migrated_store, root / "mlflow.db")
    work = root / "work"
    work.mkdir()
    env = {"MLFLOW_TRACKING_URI": sqlite_uri(root / "mlflow.db"), "VLAEVAL_CACHE_DIR": str(root / "cache")}
    for sweep in (
        ["job=residual_audit", "estimator=iid,sobol", *AUDIT_SMALL, "audit.plot=false"],
        ["job=gauntlet", "effects=none,catastrophic_safety", "strata=small", "gauntlet.plot=false"],
    ):
        proc = run_main(["-m", *sweep], work, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
    with MlflowServer(sqlite_uri(root / "mlflow.db"), root / "artifacts", root / "mlflow-server.log") as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    need(
        Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file(),
        "Chromium and ChromeDriver (Debian packages chromium, chromium-driver)",
    )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    (SCREENSHOTS / "failure.png").unlink(missing_ok=True)
    profile = tempfile.mkdtemp(prefix="vlaeval-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _wait(driver, what: str, condition, timeout: float = 60, state: Optional[Callable[[], str]] = None):
    """`condition`'s first truthy value; on timeout an error with a screenshot and, given
    `state`, what the page last looked like."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.25).until(lambda d: condition(d))
    except TimeoutException:
        shot = _screenshot(driver, "failure.png", check=False)
        raise AssertionError(
            f"the MLflow UI never showed {what} (url: {driver.current_url}; screenshot: {shot}"
            + (f"; {state()}" if state is not None else "")
            + ")"
        ) from None


def _spans(cells) -> str:
    """The row offsets a grid has rendered, as 'first-last (count)'."""
    tops = sorted({top for top, *_ in cells})
    return f"{tops[0]:.0f}-{tops[-1]:.0f} ({len(tops)})" if tops else "none"


def _open(driver, url: str) -> None:
    """Open `url` as a fresh page load, as when pasted into the address bar (a hash change alone
    leaves the single-page app showing the previous view's data)."""
    driver.get("about:blank")
    driver.get(url)


def _screenshot(driver, name: str, check: bool = True) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    final = SCREENSHOTS / name
    partial = SCREENSHOTS / f".{name}.{os.getpid()}.tmp.png"
    assert driver.save_screenshot(str(partial)), f"screenshot {name} failed"
    os.replace(partial, final)
    assert not check or final.stat().st_size > 10_000  # a rendered page, not a blank frame
    return final


def _by_exact_text(text: str) -> str:
    """XPath for the innermost element whose whole text is `text` (search highlighting splits it)."""
    return f"//*[normalize-space(.)='{text}' and not(./*[normalize-space(.)='{text}'])]"


def _close_assistant_panel(driver) -> None:
    """MLflow 3 opens its chat panel on first load; it takes a third of the width."""
    from selenium.webdriver.common.by import By

    for button in driver.find_elements(By.XPATH, "//button[@data-component-id='mlflow.assistant.chat_panel.close']"):
        button.click()


def _add_columns(driver, names: List[str]) -> None:
    """Tick columns in the runs table's *Columns* menu, as a user does: search each name, click it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.find_element(By.XPATH, "//button[normalize-space(.)='Columns']").click()
    search = _wait(
        driver, "the column search box", lambda d: d.find_element(By.XPATH, "//input[@placeholder='Search columns']")
    )
    for name in names:
        search.send_keys(Keys.CONTROL, "a")
        search.send_keys(name)
        _wait(
            driver,
            f"column {name} in the Columns menu",
            lambda d, name=name: d.find_element(By.XPATH, _by_exact_text(name)),
        ).click()
    search.send_keys(Keys.ESCAPE)


def _compare_view_metrics(driver) -> Dict[str, List[str]]:
    """The compare view's Metrics table, scrolled through as a user would: {metric name: [text
    shown per run column]}. It is two react-virtualized grids (names, values), each rendering only
    the rows in view; scrolling the values grid moves the names grid along; cells are matched by
    their row offset, which does not depend on the scroll position."""
    from selenium.webdriver.common.by import By

    section = driver.find_element(
        By.XPATH,
        "//*[contains(@class,'collapse-item')][./*[contains(@class,'collapse-header')][normalize-space(.)='Metrics']]",
    )
    names_grid, values_grid = section.find_elements(By.CSS_SELECTOR, ".ReactVirtualized__Grid")
    # Every read scrolls both grids and fires their scroll events: the names grid follows the
    # values grid only through its scroll handler, and under load a missed sync (a re-assigned
    # scrollTop fires nothing) left it rendering older rows until the wait timed out (CI, stop 20).
    read = """
        const [names, values, offset] = arguments;
        values.scrollTop = offset;
        names.scrollTop = values.scrollTop;
        for (const g of [values, names]) g.dispatchEvent(new Event('scroll'));
        const cells = g => Array.from(g.firstElementChild.children).map(c => [parseFloat(c.style.top),
            parseFloat(c.style.left), parseFloat(c.style.height), c.innerText.trim()]);
        return [values.firstElementChild.scrollHeight, cells(names), cells(values), values.scrollTop, names.scrollTop];
    """

    def covers(cells, offset: float) -> bool:  # react has rendered the row at this offset
        return any(top <= offset < top + height for top, _, height, _ in cells)

    step = 150  # pixels scrolled per read

    last_read: List[Any] = []

    def rendered_at(offset: float):
        """Both grids have rendered every row from `offset` to the next read's offset (the names
        grid follows the values grid's scroll a frame later)."""
        height, name_cells, value_cells, *scrolled = driver.execute_script(read, names_grid, values_grid, offset)
        last_read[:] = [height, scrolled, _spans(name_cells), _spans(value_cells)]
        rows = (offset, min(offset + step, height) - 1)
        done = offset >= height or all(covers(cells, y) for cells in (name_cells, value_cells) for y in rows)
        return (height, name_cells, value_cells) if done else None

    names, values, offset = {}, {}, 0
    while True:
        height, name_cells, value_cells = _wait(
            driver,
            f"the Metrics rows at offset {offset}",
            lambda _, offset=offset: rendered_at(offset),
            timeout=30,
            state=lambda: "last read: height {}, scrollTop values/names {}, rows names {}, values {}".format(
                *last_read
            ),
        )
        names.update({top: text for top, _, _, text in name_cells})
        values.update({(top, left): text for top, left, _, text in value_cells})
        if offset >= height:
            break
        offset += step
    # Back to the top, where the gate checks are: both grids, as the names grid keeps its own offset.
    for _ in range(2):
        driver.execute_script(
            "for (const g of arguments) { g.scrollTop = 0; g.dispatchEvent(new Event('scroll')); }",
            names_grid,
            values_grid,
        )
        time.sleep(0.2)
    columns = sorted({left for _, left in values})
    return {name: [values.get((top, left), "") for left in columns] for top, name in names.items()}


def test_runs_table_shows_the_audit_sweep_with_its_gate_checks(ui_server, browser):
    from selenium.webdriver.common.by import By

    client = MlflowClient(tracking_uri=ui_server.uri)
    sweep = sweep_of(client, "vlaeval-residual_audit")
    experiment_id, parent, children = sweep.experiment_id, sweep.parent, sweep.children
    _open(browser, f"{ui_server.uri}/#/experiments/{experiment_id}/runs?workflowType=machine_learning")
    parent_row = f"//*[@role='row'][@row-id='{parent.info.run_id}']"
    _wait(browser, "the sweep's parent run", lambda d: d.find_element(By.XPATH, parent_row))
    assert parent.info.run_name in browser.find_element(By.XPATH, parent_row).text
    _close_assistant_panel(browser)
    # Expand the parent: its children appear as rows of their own.
    browser.find_element(By.XPATH, f"{parent_row}//*[@col-id='attributes.`Run Name`']//button").click()
    for child in children:
        _wait(
            browser,
            f"child run {child.info.run_name}",
            lambda d, child=child: d.find_element(By.XPATH, f"//*[@role='row'][@row-id='{child.info.run_id}']"),
        )

    gate_metrics = sorted(k for k in children[0].data.metrics if k.startswith("gate."))
    assert len(gate_metrics) == 7
    _add_columns(browser, gate_metrics + AUDIT_STATISTICS)
    for child in children:
        for metric in gate_metrics + AUDIT_STATISTICS:
            cell = f"//*[@role='row'][@row-id='{child.info.run_id}']//*[@col-id='metrics.`{metric}`']"
            text = _wait(
                browser,
                f"{metric} of {child.info.run_name}",
                lambda d, cell=cell: d.find_element(By.XPATH, cell).text.strip() or None,
            )
            assert _shown_as(text, child.data.metrics[metric]), (child.info.run_name, metric, text)
    assert {c.data.tags["estimator.kind"] for c in children} == {"iid", "sobol"}
    # One readable column compares the sweep's gate outcomes: the checks each run failed, or "none".
    _add_columns(browser, ["gate.failed"])
    for child in children:
        cell = f"//*[@role='row'][@row-id='{child.info.run_id}']//*[@col-id='tags.`gate.failed`']"
        text = _wait(
            browser,
            f"gate.failed of {child.info.run_name}",
            lambda d, cell=cell: d.find_element(By.XPATH, cell).text.strip() or None,
        )
        failed = {k.removeprefix("gate.") for k in gate_metrics if child.data.metrics[k] == 0.0}
        assert text == child.data.tags["gate.failed"], (child.info.run_name, text)
        assert (set(text.split(", ")) if text != "none" else set()) == failed, (child.info.run_name, text)
    _screenshot(browser, "audit_runs_table.png")


@pytest.mark.parametrize("experiment_name", ["vlaeval-residual_audit", "vlaeval-gauntlet"])
def test_compare_view_shows_every_metric_and_gate_outcome_of_the_sweep(ui_server, browser, experiment_name):
    from selenium.webdriver.common.by import By

    client = MlflowClient(tracking_uri=ui_server.uri)
    sweep = sweep_of(client, experiment_name)
    experiment_id, children = sweep.experiment_id, sweep.children
    run_ids = [c.info.run_id for c in children]
    query = urllib.parse.urlencode(
        {"runs": json.dumps(run_ids, separators=(",", ":")), "experiments": json.dumps([experiment_id])}
    )
    _open(browser, f"{ui_server.uri}/#/compare-runs?{query}")
    _wait(
        browser,
        "the compare view",
        lambda d: f"Comparing {len(children)} Runs" in d.find_element(By.TAG_NAME, "body").text,
    )
    _wait(browser, "the Metrics table", lambda d: d.find_elements(By.XPATH, _by_exact_text("gate.pass")))
    _close_assistant_panel(browser)
    body = browser.find_element(By.TAG_NAME, "body").text
    # The run columns come in the order of the URL's list.
    assert re.search(r"Run ID:\s*" + r"\s+".join(run_ids), body), "run columns out of order"

    shown = _compare_view_metrics(browser)
    expected = set().union(*(c.data.metrics for c in children))
    assert set(shown) == expected  # every metric of the sweep, nothing else
    assert sum(name.startswith("gate.") for name in shown) == len([k for k in expected if k.startswith("gate.")]) >= 6
    for name, texts in shown.items():
        for child, text in zip(children, texts):
            if name in child.data.metrics:
                assert _shown_as(text, child.data.metrics[name]), (child.info.run_name, name, text)
            else:  # a stratum the halted gauntlet never reached: the compare view prints NaN
                assert text in ("", "-", "NaN"), (child.info.run_name, name, text)
    # The gate outcome and the decision are tags: their rows read "<tag> <run 1> <run 2>".
    for tag in ["gate.pass"] + (["recommendation", "halted"] if experiment_name == "vlaeval-gauntlet" else []):
        values = " ".join(c.data.tags[tag] for c in children)
        assert f"{tag} {values}" in body, tag
    if experiment_name == "vlaeval-gauntlet":
        # Generated outcomes: the clean candidate is a demonstration (NEEDS_REVIEW), the halted one blocked.
        assert sorted(c.data.tags["recommendation"] for c in children) == ["DO_NOT_LAUNCH", "NEEDS_REVIEW"]
    metrics_header = browser.find_element(
        By.XPATH, "//*[contains(@class,'collapse-header')][normalize-space(.)='Metrics']"
    )
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", metrics_header)
    _screenshot(browser, f"{experiment_name.removeprefix('vlaeval-')}_compare.png")
