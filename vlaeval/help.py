"""`vlaeval --help` (or `python main.py --help`): what a user needs -- the jobs, every config group with its options and
default, the sweep presets, examples -- read from the files (conf/, the jobs' docstrings) without
composing anything. Hydra's own help composes the config once per group option (~110 deep copies
of the schema repository, ~3 s); this takes well under a second. `--hydra-help` is Hydra's."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List

import yaml

PACKAGE = Path(__file__).resolve().parent
CONF = PACKAGE / "conf"  # shipped with the package (a checkout's conf/ links here)
JOBS = PACKAGE / "jobs"


def job_summaries() -> Dict[str, str]:
    """job name -> the first paragraph of its module docstring, one line (read, not imported: jobs
    import torch)."""
    out = {}
    for path in sorted(JOBS.glob("*.py")):
        if path.name == "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        first = " ".join(doc.split("\n\n", 1)[0].split())
        out[path.stem] = first.split(":", 1)[1].strip() if first.startswith(f"job={path.stem}") else first
    return out


def defaults() -> Dict[str, str]:
    config = yaml.safe_load((CONF / "config.yaml").read_text(encoding="utf-8"))
    chosen = {}
    for entry in config.get("defaults", []):
        if isinstance(entry, dict):
            chosen.update({str(k): str(v) for k, v in entry.items()})
    return chosen


# Groups that are not in the defaults list: added with +<group>=<option> (sweep presets and the
# training comparison's arms) or Hydra's own.
ADDED_GROUPS = ("hydra", "sweep", "arm")


def group_options() -> Dict[str, List[str]]:
    return {
        d.name: sorted(p.stem for p in d.glob("*.yaml"))
        for d in sorted(CONF.iterdir())
        if d.is_dir() and d.name not in ADDED_GROUPS
    }


def help_text() -> str:
    config = yaml.safe_load((CONF / "config.yaml").read_text(encoding="utf-8"))
    text = config["hydra"]["help"]
    chosen = defaults()
    lines = [text["header"].rstrip(), "", "Jobs (job=<name>):"]
    width = max(len(n) for n in job_summaries())
    lines += [f"  {name:<{width}}  {summary}" for name, summary in job_summaries().items()]
    lines += ["", "Config groups (group=option; * is the default):"]
    for group, options in group_options().items():
        marked = [f"{o}*" if chosen.get(group) == o else o for o in options]
        lines.append(f"  {group:<11} {', '.join(marked)}")
    sweeps = sorted(p.stem for p in (CONF / "sweep").glob("*.yaml"))
    lines += [
        "",
        "Sweep presets (+sweep=<name>, runs with -m built in):",
        "  " + ", ".join(sweeps),
        "",
        "Training-comparison arms (+arm=<name>, job=train; +sweep=training_comparison runs them all):",
        "  " + ", ".join(sorted(p.stem for p in (CONF / "arm").glob("*.yaml"))),
        "",
        "Launchers (hydra/launcher=<name>):",
        "  " + ", ".join(sorted(p.stem for p in (CONF / "hydra" / "launcher").glob("*.yaml"))) + ", basic, joblib",
        "",
        text["footer"].rstrip(),
        "Every setting and its default: vlaeval --cfg job; one group: --cfg job --package gauntlet.",
        "Hydra's own help: --hydra-help.",
    ]
    return "\n".join(lines) + "\n"
