"""vlaeval's single entry point: `python main.py job=<name> [overrides]` (see README.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

import vlaeval.config  # noqa: F401  (registers the structured-config schemas)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from vlaeval.cli import run_job

    return run_job(cfg)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if any(arg in ("--help", "-h") for arg in sys.argv[1:]):
        from vlaeval.help import help_text  # lists the jobs and groups without composing anything

        sys.stdout.write(help_text())
        raise SystemExit(0)
    main()
