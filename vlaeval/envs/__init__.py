"""The simulated worlds policies act in, below `policy`: an episode and its disturbances
(`episodes`), what a simulator provides (`protocol`), Meta-World's implementation (`metaworld`),
and the registry a simulator is chosen from by name."""

from __future__ import annotations

import importlib
from typing import Any, Dict, Tuple

# name -> (module, class): imported on first use (a simulator imports its heavy libraries then).
SIMULATORS: Dict[str, Tuple[str, str]] = {"metaworld": ("vlaeval.envs.metaworld", "MetaWorldSimulator")}
DEFAULT_SIMULATOR = "metaworld"


_MADE: Dict[str, Any] = {}  # one instance per simulator and process


def check_simulator(name: str) -> None:
    """A registered simulator's name (nothing imported: a job checks it before any work)."""
    from vlaeval.errors import UserInputError

    if name not in SIMULATORS:
        raise UserInputError(
            f"simulator={name} is not a registered simulator; choose one of {', '.join(sorted(SIMULATORS))} "
            "(or register yours in vlaeval.envs.SIMULATORS: docs/extending.md)"
        )


def simulator(name: str = DEFAULT_SIMULATOR) -> Any:
    """The registered simulator `name` (one instance per process), checked against the protocol."""
    from vlaeval.envs.protocol import missing_members
    from vlaeval.errors import UserInputError

    if name in _MADE:
        return _MADE[name]
    check_simulator(name)
    module, cls = SIMULATORS[name]
    made = getattr(importlib.import_module(module), cls)()
    missing = missing_members(made)
    if missing:
        raise UserInputError(
            f"simulator {name} ({module}.{cls}) lacks {', '.join(missing)} of vlaeval/envs/protocol.py"
        )
    _MADE[name] = made
    return made
