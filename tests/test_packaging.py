"""The package as a user installs it: `pip install .` (not editable) carries the config groups, and
the console entry point runs from any directory, far from the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _built_wheel(tmp_path: Path) -> Path:
    """A wheel built from a copy of what the package is made of (the checkout stays untouched)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "vlaeval", source / "vlaeval", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels), "."],
        cwd=source,
        check=True,
        timeout=300,
    )
    [wheel] = wheels.glob("vlaeval-*.whl")
    return wheel


def test_a_wheel_holds_the_configs_and_runs_a_job_from_another_directory(tmp_path):
    wheel = _built_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    shipped = {n for n in names if n.startswith("vlaeval/conf/")}
    expected = {
        f"vlaeval/conf/{p.relative_to(REPO / 'vlaeval' / 'conf')}" for p in (REPO / "vlaeval/conf").rglob("*.yaml")
    }
    assert shipped == expected and "vlaeval/conf/config.yaml" in shipped
    target = tmp_path / "installed"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The installed copy, not the checkout's editable one: PYTHONPATH comes before the editable finder.
    env = {**os.environ, "PYTHONPATH": str(target), "VLAEVAL_CACHE_DIR": str(tmp_path / "cache")}
    script = target / "bin" / "vlaeval"
    where = subprocess.run(
        [sys.executable, "-c", "import vlaeval; print(vlaeval.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip().startswith(str(target)), where.stdout
    shown = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0 and "gauntlet_history" in shown.stdout and "rollout_vision" in shown.stdout, (
        shown.stderr[-2000:]
    )
    ran = subprocess.run(
        [sys.executable, str(script), "job=gauntlet", "tracking=disabled"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    [result] = elsewhere.glob("outputs/*/result.json")
    assert json.loads(result.read_text())["recommendation"]["recommendation"] in (
        "LAUNCH",
        "NEEDS_REVIEW",
        "DO_NOT_LAUNCH",
    )
