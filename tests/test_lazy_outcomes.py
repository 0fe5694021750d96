"""Outcomes on demand: the scheduler asks a source for whole clusters batch by batch, in the
seeded evaluation order, and never for a cluster the sequential test does not need; a source with
only `load` is served by slicing it, with the very same result."""

from __future__ import annotations

from typing import List

import numpy as np

from helpers.configs import compose_config, typed_gauntlet
from vlaeval.gauntlet import ArrayCache, SyntheticOutcomes, run_gauntlet, validate_gauntlet
from vlaeval.gauntlet.outcomes import cluster_permutation, synthetic_paired_outcomes
from vlaeval.gauntlet.result import Lineage

LINEAGE = Lineage(valid=True)


class CountingSource(SyntheticOutcomes):
    """Produces each requested cluster on demand (from the synthetic generator's outcomes, so the
    numbers can be compared) and records every request, as a rollout source would run them."""

    produces_on_demand = True

    def __init__(self) -> None:
        self.requests: dict = {}

    def produce(self, request, clusters, cache):
        whole = synthetic_paired_outcomes(request.stratum, request.spec, request.effect, request.seed)
        self.requests.setdefault(request.stratum, []).append(np.asarray(clusters).copy())
        return whole.reordered(np.asarray(clusters)), "produced"


class LoadOnly:
    """A source written before `produce`: describe/validate/cluster_sizes/load only."""

    def __init__(self) -> None:
        self.inner = SyntheticOutcomes()

    def available_strata(self):
        return None

    def describe(self):
        return self.inner.describe()

    def validate(self, strata, effects):
        self.inner.validate(strata, effects)

    def cluster_sizes(self, request):
        return self.inner.cluster_sizes(request)

    def load(self, request, cache):
        return self.inner.load(request, cache)


# One order seed for both sources: an on-demand source would otherwise draw a fresh one per run.
def run(source, overrides=("strata=small", "effects=safety_regression_mild", "gauntlet.order_seed=11")):
    settings, strata, effects = typed_gauntlet(compose_config(list(overrides)))
    validate_gauntlet(settings, strata, effects)
    cache = ArrayCache("/nonexistent", enabled=False, namespace="gauntlet-units")
    return settings, run_gauntlet(settings, strata, effects, source, cache, LINEAGE).to_json()


def comparable(result):
    keep = ("stratum", "decision", "units_evaluated", "clusters_evaluated", "delta_estimate", "success_rates")
    return [{k: s[k] for k in keep} for s in result["strata"]]


def test_clusters_are_requested_batch_by_batch_and_never_past_the_decision():
    source = CountingSource()
    settings, result = run(source)
    eager_settings, eager = run(SyntheticOutcomes())
    assert comparable(result) == comparable(eager)  # on demand changes nothing but what is produced
    saved = 0
    for stratum in result["strata"]:
        name = stratum["stratum"]
        asked: List[np.ndarray] = source.requests.get(name, [])
        requested = np.concatenate(asked) if asked else np.zeros(0, np.int64)
        assert stratum["cluster_order"]["order_seed"] == settings.order_seed == 11
        order = cluster_permutation(stratum["clusters_available"], 11, name)
        # Exactly the evaluation order's prefix the test used, one request per batch, nothing twice.
        assert requested.tolist() == order[: stratum["clusters_evaluated"]].tolist()
        assert len(asked) == stratum["batches"]
        assert stratum["units_produced"] == stratum["units_evaluated"]
        saved += stratum["unit_limit"] - stratum["units_produced"]
    eager_produced = sum(s["units_produced"] for s in eager["strata"])
    assert eager_produced == sum(s["units_available"] for s in eager["strata"])  # the eager source made it all
    assert saved > 0 and saved == sum(s["units_saved_by_early_stop"] for s in result["strata"])
    assert result["scale"]["units_produced"] == result["scale"]["units_evaluated"]
    assert result["scale"]["produced_on_demand"] and not eager["scale"]["produced_on_demand"]
    # Strata the gauntlet never reached were never asked for.
    evaluated = {s["stratum"] for s in result["strata"]}
    assert set(source.requests) <= evaluated


def test_a_source_with_only_load_is_served_by_slicing_it_with_the_same_result():
    _, legacy = run(LoadOnly(), ("strata=small",))
    _, eager = run(SyntheticOutcomes(), ("strata=small",))
    assert comparable(legacy) == comparable(eager)
