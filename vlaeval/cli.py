"""The edge between Hydra and the jobs: one-line errors, exit codes, no half-written output."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from vlaeval.errors import UserInputError

# Exit codes (README "Exit codes"): 0 done; 2 bad input (one line, nothing written); 3 the result is
# saved but the tracking store failed (job=sync uploads it); a job may ask for its own through
# result["exit_code"]: job=reproduce 4 when the run did not reproduce; job=gauntlet with
# gauntlet.exit_code_from_recommendation=true 10 NEEDS_REVIEW, 11 DO_NOT_LAUNCH; job=residual_audit with
# audit.exit_code_from_gate=true 12 a gate check failed, 13 a smoke run (no certificate), 14 the ratio UNDECIDED. A sweep's jobs never
# exit early: their codes are in their results.
EXIT_BAD_INPUT = 2
EXIT_TRACKING = 3
EXIT_INTERRUPTED = 130  # the shell's code for a SIGINT (128 + 2)


def _remove_if_only_hydra_files(output_dir: str | None) -> None:
    """Bad input leaves nothing behind: drop the run directory if it holds only Hydra's own
    files (.hydra/ and the log); anything else in it is kept."""
    if not output_dir:
        return
    path = Path(output_dir)
    if path.is_dir() and all(p.name == ".hydra" or p.suffix == ".log" for p in path.iterdir()):
        shutil.rmtree(path, ignore_errors=True)
        parent = path.parent
        if parent != Path.cwd() and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()  # the outputs/ folder Hydra made for this run alone


# The config groups ship inside the package (a wheel holds them; a checkout's conf/ links here).
CONF_DIR = Path(__file__).resolve().parent / "conf"


def main() -> None:
    """`vlaeval job=<name> [overrides]` (the console entry point; `python main.py` is the same):
    --help lists the jobs and groups without composing anything, else Hydra runs run_job."""
    if any(arg in ("--help", "-h") for arg in sys.argv[1:]):
        from vlaeval.help import help_text

        sys.stdout.write(help_text())
        raise SystemExit(0)
    import vlaeval.config  # noqa: F401  (registers the structured-config schemas)

    hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(run_job)()


def run_job(cfg: DictConfig) -> float | None:
    from vlaeval import console
    from vlaeval.jobs import dispatch
    from vlaeval.tracking import TrackingError

    try:
        _clean_cache(cfg)
        result = dispatch(cfg)
    except UserInputError as error:
        console.print_error(str(error))
        _remove_if_only_hydra_files(_hydra_output_dir())
        raise SystemExit(EXIT_BAD_INPUT) from None
    except TrackingError as error:
        console.print_error(str(error))
        raise SystemExit(EXIT_TRACKING) from None
    except KeyboardInterrupt:
        # Every output is written to a temporary name and renamed: an interrupted job leaves no
        # half-written file (a stale temporary is removed by the next job), so one line says it all.
        console.print_error("interrupted; nothing half-written (a finished cache entry is kept for the next run)")
        _remove_if_only_hydra_files(_hydra_output_dir())
        raise SystemExit(EXIT_INTERRUPTED) from None
    if result.exit_code and not _in_multirun():
        raise SystemExit(result.exit_code)
    # A number Hydra sweepers can optimise: 1.0 when every gate check passed.
    checks = result.run.checks if result.run is not None else None
    return float(all(checks.values())) if checks else None


def _in_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().mode) == "RunMode.MULTIRUN"
    except Exception:
        return False


def _clean_cache(cfg: DictConfig) -> None:
    """A job killed mid-write (SIGKILL) leaves a temporary file, never a partial cache entry: the
    next job removes such leftovers."""
    import logging

    from vlaeval.artifacts import remove_stale_temporaries

    for leftover in remove_stale_temporaries(str(cfg.paths.cache_dir)):
        logging.getLogger(__name__).warning("removed %s, left by a job that was killed while writing it", leftover)


def _hydra_output_dir() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.output_dir
    except Exception:
        return None
