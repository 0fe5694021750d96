"""main.py as a user runs it, in a working folder of its own (outputs/, multirun_sweeps/ and
.cache/ land there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

from helpers.configs import MAIN


def run_main(
    args: List[str], cwd: Path, env: Optional[Dict[str, str]] = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "VLAEVAL_"))}
    full_env.update({"PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", "HYDRA_FULL_ERROR": "0"})
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, str(MAIN), *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def sqlite_uri(path: Path) -> str:
    return f"sqlite:///{path}"
