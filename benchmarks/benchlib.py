"""What the benchmark scripts share: the composed default config and the default trained policy."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hydra import compose, initialize_config_dir  # noqa: E402

import vlaeval.config  # noqa: E402,F401  (registers the schemas)


def compose_default(overrides: Sequence[str] = ()) -> Any:
    """conf/config.yaml with overrides, outside any Hydra run (outputs go nowhere)."""
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        return compose("config", overrides=["paths.output_dir=/tmp/vlaeval-benchmark-unused", *overrides])


def default_policy(overrides: Sequence[str] = ()) -> Tuple[Any, Any, Any]:
    """(cfg, data, policy handle) of the builtin checkpoint, trained on first use."""
    from vlaeval.policy.builtin import PolicySpec, obtain_policy, prepare_data

    cfg = compose_default(overrides)
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
    return cfg, data, obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, str(cfg.paths.cache_dir), data)
