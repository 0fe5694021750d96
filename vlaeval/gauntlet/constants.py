"""What a stratum's test may depend on besides its outcomes, fixed before its first cluster: the
order in which its clusters are evaluated, and the cluster-size bounds behind the bet cap and the
unit estimand's weights. Pure apart from drawing a fresh seed.

None of these may be read off the outcomes being tested -- that is what keeps the test exact:

* **Order seed.** The e-process controls the conditional mean given the past, so clusters must come
  in random order, and the order must be random *for each file*: one permutation shared by every
  file of the same shape (the old default, `gauntlet.seed`) made the error rate given the seed range
  from 0.2% to 50.5% on a file sorted worst scenes first. An exact test of a source that holds its
  outcomes (a file) chooses no order at all: it averages `gauntlet.orders` fixed orders seeded from
  the clusters' canonical digest (vlaeval.seqtest.order_free), and `gauntlet.order_seed` is refused
  for it (any order a user can pick -- a seed, the file's bytes -- can be shopped for). Otherwise the
  seed is, unless `gauntlet.order_seed` is given: for a file under an approximate mode, the clusters'
  canonical digest; for a source that runs policies (rollouts), a fresh random seed drawn at run
  start (a scene grid in a fixed permutation is no more random than in file order); for generated
  outcomes, which are i.i.d. by construction, `gauntlet.seed`.
* **Cluster-size bounds.** For a source whose scenario plan is fixed before any outcome
  (synthetic, rollouts), the plan's extremes. For a source that holds its outcomes, the file's
  cluster sizes are part of the sample: the unit estimand's normaliser must be declared
  (`strata.<name>.max_cluster_size`), and the bet cap uses a declared smallest size or the
  predictable running minimum of the clusters already seen.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Dict, Optional

import numpy as np

from vlaeval.artifacts import stable_seed
from vlaeval.choices import Estimand
from vlaeval.config import GauntletConfig, StratumConfig
from vlaeval.errors import require
from vlaeval.gauntlet.sources import checked_source

ORDER_FROM_SETTING = "gauntlet.order_seed"
ORDER_FROM_CONTENT = "content digest"  # the clusters' canonical digest (the bytes' for a source without one)
ORDER_FROM_FRESH_DRAW = "fresh random draw at run start"
ORDER_FROM_SEED = "gauntlet.seed"


@dataclass(frozen=True)
class OrderSeed:
    """The run's cluster-order seed and where it came from (each stratum mixes in its own name)."""

    seed: int
    basis: str  # one of the ORDER_FROM_* values

    def as_dict(self) -> Dict[str, Any]:
        return {"order_seed": self.seed, "basis": self.basis}


def run_order_seed(settings: GauntletConfig, source: Any, replay: Optional[int] = None) -> OrderSeed:
    """The cluster-order seed of this run (see the module docstring). `replay`: the fresh seed of
    an earlier run that job=reproduce re-runs."""
    source = checked_source(source)
    require(
        settings.order_seed is None or not source.traits.holds_outcomes,
        f"gauntlet.order_seed={settings.order_seed} cannot be set for outcomes that all exist (an outcome file): "
        "its decisions average gauntlet.orders fixed orders seeded from the clusters themselves, so no order is "
        "chosen -- one that could be would be shopped for; remove gauntlet.order_seed",
    )
    if settings.order_seed is not None:
        return OrderSeed(int(settings.order_seed), ORDER_FROM_SETTING)
    if source.traits.holds_outcomes:
        # The clusters' canonical digest where the source gives one (no id, row order or format
        # changes it); the bytes' digest otherwise.
        described = source.describe()
        digest = described.get("canonical_sha256") or described.get("sha256")
        require(
            bool(digest),
            "the outcome source holds its outcomes but describes no sha256 of them; its cluster order "
            "needs one (describe()['sha256']), or set gauntlet.order_seed",
        )
        return OrderSeed(stable_seed("cluster-order-of-content", str(digest)), ORDER_FROM_CONTENT)
    if source.traits.produces_on_demand:
        if replay is not None:
            return OrderSeed(int(replay), ORDER_FROM_FRESH_DRAW)
        return OrderSeed(secrets.randbits(63), ORDER_FROM_FRESH_DRAW)
    return OrderSeed(int(settings.seed), ORDER_FROM_SEED)


@dataclass(frozen=True)
class ClusterSizeBounds:
    """The largest and smallest cluster the stratum's test assumes, and where each came from."""

    largest: Optional[int]  # the unit estimand's normaliser (None: not needed)
    largest_from: str
    smallest: Optional[int]  # the bet cap's n_min (None: the running minimum)
    smallest_from: str

    def as_dict(self) -> Dict[str, Any]:
        return {
            "max_cluster_size": self.largest,
            "max_cluster_size_from": self.largest_from,
            "min_cluster_size": self.smallest,
            "min_cluster_size_from": self.smallest_from,
        }


def cluster_size_bounds(
    name: str, spec: StratumConfig, sizes: np.ndarray, *, estimand: str, plan_fixed_in_advance: bool
) -> ClusterSizeBounds:
    """The bounds for stratum `name` whose clusters have `sizes`; a one-line UserInputError where a
    needed bound is not declared or a cluster lies outside a declared one (before any work)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    where = f"strata.{name}"
    if spec.max_cluster_size is not None:
        require(spec.max_cluster_size >= 1, f"{where}.max_cluster_size={spec.max_cluster_size} must be >= 1")
        require(
            not sizes.size or int(sizes.max()) <= spec.max_cluster_size,
            f"stratum {name} has a cluster of {int(sizes.max()) if sizes.size else 0} units, more than its declared "
            f"{where}.max_cluster_size={spec.max_cluster_size}; declare the largest cluster its scenarios can produce",
        )
        largest: Optional[int] = int(spec.max_cluster_size)
        largest_from = "declared"
    elif plan_fixed_in_advance:
        largest, largest_from = (int(sizes.max()) if sizes.size else 1), "the scenario plan (fixed before outcomes)"
    else:
        require(
            estimand != Estimand.unit,
            f"gauntlet.estimand=unit needs {where}.max_cluster_size: the largest cluster its scenario distribution "
            "can produce, declared before the test (the file's own largest cluster is one of the outcomes being "
            "tested): the largest scene your scenario generator can produce, from its design, not from this file",
        )
        largest, largest_from = None, "not needed (estimand=cluster)"
    if spec.min_cluster_size is not None:
        require(spec.min_cluster_size >= 1, f"{where}.min_cluster_size={spec.min_cluster_size} must be >= 1")
        require(
            not sizes.size or int(sizes.min()) >= spec.min_cluster_size,
            f"stratum {name} has a cluster of {int(sizes.min()) if sizes.size else 0} units, fewer than its declared "
            f"{where}.min_cluster_size={spec.min_cluster_size}; lower it or leave it unset",
        )
        smallest: Optional[int] = int(spec.min_cluster_size)
        smallest_from = "declared"
    elif plan_fixed_in_advance:
        smallest, smallest_from = (int(sizes.min()) if sizes.size else 1), "the scenario plan (fixed before outcomes)"
    else:
        smallest, smallest_from = None, "running minimum of the clusters seen before each bet"
    if largest is not None and smallest is not None:
        require(
            smallest <= largest,
            f"{where}: min_cluster_size={smallest} exceeds max_cluster_size={largest}",
        )
    return ClusterSizeBounds(largest, largest_from, smallest, smallest_from)
