"""Outcome sources: paired (baseline, candidate) 0/1 outcomes per scenario, grouped in clusters.

A source is chosen with `outcomes=<name>` and built with `hydra.utils.instantiate`, so a team can
plug in its own (a simulator farm, a replay service) through `_target_`. The protocol:

    describe() -> dict                     the data source, for lineage
    validate(strata, effects) -> None      raise UserInputError before any work starts
    available_strata() -> list | None      the strata the source holds (None: any configured one)
    cluster_sizes(request) -> array        the stratum's scenario plan, known before any outcome
    produce(request, clusters, cache)      the outcomes of these clusters (indices into the plan), in
        -> (StratumOutcomes, cache_status) that order: asked batch by batch, so a source that runs
                                           something per unit (rollouts) runs only what the test needs
    load(request, cache)                   the whole stratum at once (sources that hold it anyway)

Optional: `holds_outcomes` (its outcomes exist before the test: the cluster sizes are part of the
sample, the order seed is a digest of `describe()['sha256']`), `produces_on_demand` (rollouts: the
order seed is drawn fresh per run), `data_label` (the label of every unit, whatever the stratum
says: GENERATED, SIMULATED), `stratum_data_labels()` (labels the source declares per stratum, e.g.
an outcome file's `data_label` column). For a source that runs policies
(vlaeval.gauntlet.rollouts): `context` in the constructor (the run's config sections), `prepare()`
-> (baseline, candidate) versions before the first cluster, `close()`, `notices()`, `batch_units`
(replaces gauntlet.batch_units), `paired_outcomes_table()` and `failures()` (the job writes the
paired-outcome file and feeds the failure registry).

The scheduler never asks for a cluster the sequential test does not need; it takes clusters in a
random order (`cluster_permutation`, seeded per vlaeval.gauntlet.constants) unless the user
declares the source's order random.
A source with `load` but no `produce` is served by slicing what `load` returns (`producer`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from vlaeval.artifacts import sha256_file, sha256_json, stable_seed
from vlaeval.choices import DataLabel, StrataFrom
from vlaeval.config import StratumConfig
from vlaeval.errors import UserInputError, require, require_file
from vlaeval.gauntlet.cache import ArrayCache
from vlaeval.gauntlet.ledger import cluster_keys
from vlaeval.gauntlet.sources import CheckedSource
from vlaeval.seqtest.simulation import FRESH_FRACTION, RATE_RANGE, SCENE_SD
from vlaeval.seqtest.units import (
    cluster_means,
    cluster_offsets,
    dirichlet_multinomial_logpmf,
    fit_dirichlet_multinomial,
)

# Bump when the synthetic generator changes what it produces: old cache entries become misses.
SYNTHETIC_GENERATOR_VERSION = 1
SYNTHETIC_VERSIONS = ("baseline-v3", "candidate-v4")  # (baseline, candidate): the prototype's demonstration names
VERSION_COLUMNS = ("baseline_version", "candidate_version")  # optional in an outcome file: one value each
OUTCOME_COLUMNS = ("stratum", "scenario_id", "cluster_id", "baseline", "candidate")
LABEL_COLUMN = "data_label"  # optional: where a stratum's evidence came from (REPLAYED, SIMULATED, ...)
# A repeated cluster is flagged when chance (a scene's pairs by a Dirichlet-multinomial fitted to the
# stratum, its per-episode columns at their frequencies; see repeated_clusters) would repeat it this rarely.
DUPLICATE_CHANCE = 1e-6
# An extra column whose multiset of values per cluster repeats across at least this share of the
# clusters is fixed by design (seed indices 0..7 in every scene), not evidence of a copy.
FIXED_BY_DESIGN_SHARE = 0.5


@dataclass
class StratumOutcomes:
    """Unit outcomes in evaluation order; clusters are contiguous runs of `cluster_sizes`."""

    baseline: np.ndarray  # bool (units,)
    candidate: np.ndarray  # bool (units,)
    cluster_sizes: np.ndarray  # int64 (clusters,)
    # Where each cluster starts (and the end), computed once: a stratum is sliced batch by batch.
    _offsets: Optional[np.ndarray] = field(default=None, repr=False, compare=False)

    def offsets(self) -> np.ndarray:
        if self._offsets is None:
            self._offsets = cluster_offsets(self.cluster_sizes)
        return self._offsets

    @property
    def units(self) -> int:
        return int(self.baseline.size)

    def to_arrays(self) -> Dict[str, np.ndarray]:
        return {
            "baseline_bits": np.packbits(self.baseline),
            "candidate_bits": np.packbits(self.candidate),
            "units": np.array([self.units], dtype=np.int64),
            "cluster_sizes": self.cluster_sizes.astype(np.int64),
        }

    def reordered(self, order: np.ndarray) -> "StratumOutcomes":
        """The clusters `order` (indices of whole clusters: a permutation, or any selection) in that order."""
        sizes = self.cluster_sizes[order]
        moved = self.offsets()[:-1][order] - cluster_offsets(sizes)[:-1]  # per cluster
        units = np.repeat(moved, sizes) + np.arange(int(sizes.sum()))
        return StratumOutcomes(self.baseline[units], self.candidate[units], sizes)

    def paired_means(self) -> np.ndarray:
        """Each cluster's mean paired difference, candidate minus baseline (what the tests update on)."""
        return cluster_means(self.candidate.astype(np.int8) - self.baseline.astype(np.int8), self.cluster_sizes)

    def cluster_successes(self) -> Tuple[np.ndarray, np.ndarray]:
        """(baseline, candidate) successes per cluster."""
        starts = cluster_offsets(self.cluster_sizes)[:-1]
        if starts.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return (
            np.add.reduceat(self.baseline.astype(np.int64), starts),
            np.add.reduceat(self.candidate.astype(np.int64), starts),
        )

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "StratumOutcomes":
        n = int(arrays["units"][0])
        return cls(
            np.unpackbits(arrays["baseline_bits"], count=n).astype(bool),
            np.unpackbits(arrays["candidate_bits"], count=n).astype(bool),
            np.asarray(arrays["cluster_sizes"], dtype=np.int64),
        )


@dataclass(frozen=True)
class OutcomeRequest:
    stratum: str
    spec: StratumConfig
    effect: float
    seed: int
    baseline_version: str
    candidate_version: str


# What effects.<stratum> plants: a success-rate difference (synthetic outcomes) or a degradation of
# the candidate's rollouts (a mapping such as {action_noise: 0.5}).
PlantedEffect = float | Dict[str, Any]


def success_rate_effect(planted: Optional[PlantedEffect]) -> float:
    """A planted effect as a success-rate difference: a number as it is; a rollout degradation (a
    mapping) has no size known in advance: 0."""
    return float(planted) if isinstance(planted, (int, float)) else 0.0


def stratum_data_label(source: CheckedSource, name: str, spec: StratumConfig) -> str:
    """Where a stratum's evidence came from: what the source declares for the stratum (an outcome
    file's data_label column), else the label of every unit it makes (generated, simulated), else
    the stratum's configured label."""
    declared = source.stratum_data_labels()
    if name in declared:
        return declared[name]
    return str(source.traits.data_label or spec.data_label)


def cluster_permutation(n_clusters: int, order_seed: int, stratum: str) -> np.ndarray:
    """The seeded random order in which a stratum's clusters are evaluated (a stable digest of the
    stratum name, never Python's salted hash, so every process draws the same order)."""
    return np.random.default_rng([int(order_seed), stable_seed("cluster-order", stratum)]).permutation(int(n_clusters))


def planned_cluster_sizes(spec: StratumConfig) -> np.ndarray:
    """The synthetic stratum's clusters: `cluster_size` units each, the last one taking the rest."""
    n, size = int(spec.units), int(spec.cluster_size)
    n_clusters = -(-n // size)
    sizes = np.full(n_clusters, size, dtype=np.int64)
    sizes[-1] = n - size * (n_clusters - 1)
    return sizes


def synthetic_paired_outcomes(stratum: str, spec: StratumConfig, effect: float, seed: int) -> StratumOutcomes:
    """The prototype's paired generator, vectorised: a shared uniform per scenario decides both
    policies' outcomes (paired), a per-cluster scene offset moves the success rate, and 4% of
    the candidate's scenarios draw a fresh uniform. The generator is seeded by a stable digest of
    the stratum name (the prototype used hash(), which Python salts per process)."""
    n = int(spec.units)
    rng = np.random.default_rng([int(seed), stable_seed("gauntlet-stratum", stratum)])
    u = rng.random(n)
    size = int(spec.cluster_size)
    n_clusters = -(-n // size)
    scene = rng.normal(0.0, SCENE_SD, size=n_clusters)
    p_base = np.clip(float(spec.base_rate) + np.repeat(scene, size)[:n], *RATE_RANGE)
    p_cand = np.clip(p_base + float(effect), *RATE_RANGE)
    flip = rng.random(n) < FRESH_FRACTION
    fresh = rng.random(n)
    return StratumOutcomes(u < p_base, np.where(flip, fresh, u) < p_cand, planned_cluster_sizes(spec))


class WholeStratumSource:
    """`produce` for a source whose stratum exists as a whole once loaded (generated or read): the
    requested clusters are sliced from it, the stratum loaded once per request."""

    produces_on_demand = False  # the whole stratum is made when first asked for

    def produce(
        self, request: OutcomeRequest, clusters: np.ndarray, cache: Optional[ArrayCache]
    ) -> Tuple[StratumOutcomes, str]:
        loaded = getattr(self, "_loaded", None)
        if loaded is None or loaded[0] != request:
            outcomes, status = self.load(request, cache)  # type: ignore[attr-defined]
            loaded = (request, outcomes, status)
            self._loaded = loaded
        return loaded[1].reordered(np.asarray(clusters, dtype=np.int64)), loaded[2]


def producer(
    source: CheckedSource, request: OutcomeRequest, cache: Optional[ArrayCache]
) -> Callable[[np.ndarray], Tuple[StratumOutcomes, str]]:
    """fetch(clusters) -> (StratumOutcomes, cache_status) for one stratum of `source`: its own
    `produce`, or slices of its `load` (a source written before `produce` existed)."""
    if source.produces:
        return lambda clusters: source.produce(request, clusters, cache)
    whole: List[Tuple[StratumOutcomes, str]] = []

    def fetch(clusters: np.ndarray) -> Tuple[StratumOutcomes, str]:
        if not whole:
            whole.append(source.load(request, cache))
        return whole[0][0].reordered(np.asarray(clusters, dtype=np.int64)), whole[0][1]

    return fetch


class SyntheticOutcomes(WholeStratumSource):
    """The prototype's synthetic paired generator with planted per-stratum effects, cached."""

    holds_outcomes = False  # produced on request: the planner simulates instead
    # Made up, whatever the strata's configured labels say: the recommendation calls it a demonstration.
    data_label = DataLabel.GENERATED.value

    def available_strata(self) -> Optional[List[str]]:
        return None  # it generates any configured stratum

    def versions(self) -> Tuple[str, str]:
        """The demonstration's names (the prototype's): generated outcomes compare no real policies."""
        return SYNTHETIC_VERSIONS

    def cluster_sizes(self, request: OutcomeRequest) -> np.ndarray:
        return planned_cluster_sizes(request.spec)

    def describe(self) -> Dict[str, Any]:
        return {
            "kind": "synthetic",
            "generator_version": SYNTHETIC_GENERATOR_VERSION,
            "sha256": f"synthetic-generator-v{SYNTHETIC_GENERATOR_VERSION}",
        }

    def validate(self, strata: Mapping[str, StratumConfig], effects: Mapping[str, float]) -> None:
        for name, effect in effects.items():
            require(
                isinstance(effect, (int, float)),
                f"effects.{name}={effect} is a rollout degradation; synthetic outcomes plant a success-rate "
                f"difference in [-1, 1] (effects.{name}=-0.05) -- or use outcomes=rollout",
            )
            require(
                -1.0 <= float(effect) <= 1.0,
                f"effects.{name}={effect} is outside [-1, 1]; a planted effect is a difference of success rates",
            )

    def cache_payload(self, request: OutcomeRequest) -> Dict[str, Any]:
        spec = request.spec
        return {
            "kind": "gauntlet-units",
            "stratum": request.stratum,
            "units": int(spec.units),
            "base_rate": float(spec.base_rate),
            "cluster_size": int(spec.cluster_size),
            "effect": float(request.effect),
            "seed": int(request.seed),
            "baseline_version": request.baseline_version,
            "candidate_version": request.candidate_version,
            "generator_version": SYNTHETIC_GENERATOR_VERSION,
            "numpy_major": int(np.__version__.split(".")[0]),
        }

    def load(self, request: OutcomeRequest, cache: ArrayCache) -> tuple[StratumOutcomes, str]:
        arrays, status = cache.get_or_compute(
            self.cache_payload(request),
            lambda: synthetic_paired_outcomes(request.stratum, request.spec, request.effect, request.seed).to_arrays(),
        )
        return StratumOutcomes.from_arrays(arrays), status


class FileOutcomes(WholeStratumSource):
    """Paired outcomes from a CSV or Parquet file with columns
    stratum, scenario_id, cluster_id, baseline, candidate (outcomes 0/1), and optionally data_label
    (one of REPLAYED, SIMULATED, COUNTERFACTUAL, GENERATED; one value per stratum).

    Rows of one cluster are kept together (clusters in the order they first appear), so a batch
    never splits a cluster; the scheduler then evaluates the clusters in a seeded random order.
    The file's rows are the stratum's units and its clusters the stratum's plan: `strata.*.units`
    and `cluster_size` describe the synthetic source only. The strata evaluated are the file's
    (strata="file") or must all be configured (strata="config").
    """

    holds_outcomes = True  # its outcomes exist before the gauntlet: the planner may read them

    def __init__(self, path: str, strata: StrataFrom = StrataFrom.file) -> None:
        require(
            path is not None and str(path) not in ("", "???"),
            "outcomes=file needs a file: add outcomes.path=<file.csv|file.parquet>",
        )
        require(
            str(strata) in StrataFrom.values(),
            f"outcomes.strata={str(strata)!r} is unknown; use one of {', '.join(StrataFrom.values())}",
        )
        self.path = Path(str(path))
        self.strata_from = StrataFrom(str(strata))
        self._by_stratum: Dict[str, StratumOutcomes] | None = None
        self._labels: Dict[str, str] = {}
        self._notices: List[str] = []
        self._sha256: str | None = None
        self._canonical: str | None = None
        self._versions: Tuple[Optional[str], ...] = (None, None)

    def versions(self) -> Tuple[Optional[str], Optional[str]]:
        """The optional baseline_version and candidate_version columns' values (None without them)."""
        return self._versions[0], self._versions[1]

    def _declared_version(self, column: str, values: Optional[List[object]]) -> Optional[str]:
        """The one version an optional version column names (None without the column)."""
        if values is None:
            return None
        found = sorted({str(v).strip() for v in values} - {""})
        require(
            len(found) == 1,
            f"outcome file {self.path}: column {column} holds {', '.join(found) or 'nothing'}; give it one version "
            "for the whole file (or drop the column and name it with gauntlet." + column + "=...)",
        )
        return found[0]

    def describe(self) -> Dict[str, Any]:
        return {
            "kind": "file",
            "path": str(self.path.resolve()),
            "sha256": self._sha256,
            "canonical_sha256": self._canonical,
        }

    def _read_table(self) -> Any:  # a pandas DataFrame (pandas is imported lazily)
        import pandas as pd

        suffix = self.path.suffix.lower()
        require_file(self.path, f"outcomes.path={self.path}", "pass a CSV or Parquet file of paired outcomes")
        require(suffix in (".csv", ".parquet", ".pq"), f"outcomes.path={self.path} must end in .csv or .parquet")
        try:
            if suffix == ".csv":
                return pd.read_csv(self.path, dtype={"stratum": str, "scenario_id": str, "cluster_id": str})
            return pd.read_parquet(self.path)
        except Exception as error:
            raise UserInputError(
                f"outcomes.path={self.path} cannot be read ({type(error).__name__}: {error}); "
                "check that it is a valid CSV or Parquet file"
            ) from error

    def validate(self, strata: Mapping[str, StratumConfig], effects: Mapping[str, float]) -> None:
        require(not effects, "effects can only be planted in synthetic outcomes; use effects=none with outcomes=file")
        table = self._read_table()
        missing = [c for c in OUTCOME_COLUMNS if c not in table.columns]
        require(
            not missing,
            f"outcome file {self.path} lacks column(s) {', '.join(missing)}; required: {', '.join(OUTCOME_COLUMNS)}",
        )
        require(len(table) > 0, f"outcome file {self.path} has no rows")
        for column in OUTCOME_COLUMNS:
            bad = table[column].isna()
            require(
                not bad.any(),
                f"outcome file {self.path}: column {column} is empty {self._position(int(bad.to_numpy().argmax()))}; "
                "fill it or drop the row",
            )
        for column in ("baseline", "candidate"):
            values = table[column]
            numeric = (
                values.astype(str)
                .str.strip()
                .str.lower()
                .map({"0": 0, "1": 1, "0.0": 0, "1.0": 1, "true": 1, "false": 0})
            )
            if numeric.isna().any():
                first = int(numeric.isna().to_numpy().argmax())
                raw = values.iloc[first]
                raw = raw.item() if hasattr(raw, "item") else raw
                raise UserInputError(
                    f"outcome file {self.path}: {column}={raw!r} {self._position(first)} "
                    "is not a 0/1 outcome; encode success as 1 and failure as 0"
                )
            table[column] = numeric.astype(bool)
        table["stratum"] = table["stratum"].astype(str)
        table["scenario_id"] = table["scenario_id"].astype(str)
        table["cluster_id"] = table["cluster_id"].astype(str)
        duplicated = table["scenario_id"].duplicated()
        if duplicated.any():
            dup = table["scenario_id"][duplicated].iloc[0]
            raise UserInputError(
                f"outcome file {self.path}: scenario_id {dup!r} appears more than once; "
                "each scenario must have one paired row"
            )
        unknown = sorted(set(table["stratum"]) - set(strata))
        if unknown and self.strata_from == "config":
            raise UserInputError(
                f"outcome file {self.path}: unknown stratum {unknown[0]!r}; known strata: "
                f"{', '.join(strata)} (add it to the strata config, fix the file, or use outcomes.strata=file)"
            )
        self._labels = self._declared_labels(table)
        self._versions = tuple(
            self._declared_version(column, list(table[column].dropna()) if column in table.columns else None)
            for column in VERSION_COLUMNS
        )
        self._by_stratum = {}
        self._notices = []
        for name, rows in table.groupby("stratum", sort=False):
            # Stable regrouping: clusters in order of first appearance, rows in file order.
            order = rows["cluster_id"].map({c: i for i, c in enumerate(rows["cluster_id"].unique())})
            rows = rows.assign(_cluster_rank=order.to_numpy()).sort_values("_cluster_rank", kind="stable")
            sizes = rows.groupby("_cluster_rank", sort=True).size().to_numpy(dtype=np.int64)
            self._by_stratum[str(name)] = StratumOutcomes(
                rows["baseline"].to_numpy(dtype=bool), rows["candidate"].to_numpy(dtype=bool), sizes
            )
            repeated = repeated_clusters(rows.drop(columns=["scenario_id", "_cluster_rank"]))
            if repeated:
                a, b = repeated[0]
                self._notices.append(
                    f"outcome file {self.path}, stratum {name}: {len(repeated)} cluster(s) repeat another one's rows "
                    f"under different ids (e.g. {b!r} = {a!r}), which chance would do with probability below "
                    f"{DUPLICATE_CHANCE:g}: if one scene was exported twice it counts twice, which the test's "
                    "guarantee does not cover; check the export (the decision stands as computed: never drop "
                    "clusters after seeing a result)"
                )
        self._sha256 = sha256_file(self.path)
        # The clusters' canonical digest: no id, row order, format or extra column changes it.
        self._canonical = sha256_json(
            {
                name: sorted(cluster_keys(o.baseline, o.candidate, o.cluster_sizes))
                for name, o in self._by_stratum.items()
            }
        )

    def _position(self, index: int) -> str:
        """Where data row `index` (0-based) is, in the words an editor uses: a CSV's line number (its
        header is line 1), a Parquet table's row."""
        return f"on line {index + 2}" if self.path.suffix.lower() == ".csv" else f"in row {index} (counting from 0)"

    def _declared_labels(self, table: Any) -> Dict[str, str]:
        """The optional data_label column: one valid label per stratum (a one-line error otherwise)."""
        if LABEL_COLUMN not in table.columns:
            return {}
        labels: Dict[str, str] = {}
        for name, values in table.groupby("stratum", sort=False)[LABEL_COLUMN]:
            found = sorted({str(v).strip() for v in values.dropna()})
            require(
                len(found) == 1 and found[0] in DataLabel.values(),
                f"outcome file {self.path}: stratum {name} has data_label {', '.join(found) or 'empty'}; give each "
                f"stratum one of {', '.join(DataLabel.values())}",
            )
            labels[str(name)] = found[0]
        return labels

    def stratum_data_labels(self) -> Dict[str, str]:
        """Each stratum's declared label; UNDECLARED where the file has no data_label column (never the
        strata config's label, which describes the synthetic source's strata, not this file)."""
        return {name: self._labels.get(name, DataLabel.UNDECLARED.value) for name in self._by_stratum or {}}

    def notices(self) -> List[str]:
        return list(self._notices)

    def _stratum(self, name: str) -> StratumOutcomes:
        if self._by_stratum is None:
            raise RuntimeError("FileOutcomes.validate() must run before the file is read")
        if name not in self._by_stratum:
            raise KeyError(f"stratum {name!r} is not in {self.path}")
        return self._by_stratum[name]

    def available_strata(self) -> List[str]:
        if self._by_stratum is None:
            raise RuntimeError("FileOutcomes.validate() must run before the file is read")
        return list(self._by_stratum)

    def cluster_sizes(self, request: OutcomeRequest) -> np.ndarray:
        return self._stratum(request.stratum).cluster_sizes

    def load(self, request: OutcomeRequest, cache: ArrayCache) -> tuple[StratumOutcomes, str]:
        return self._stratum(request.stratum), "file"


def repeated_clusters(rows: Any) -> List[Tuple[str, str]]:
    """(first, copy) cluster ids of clusters whose rows repeat an earlier cluster's -- every column but
    the ids and data_label, compared as multisets (row order is no evidence) -- more often than chance
    explains. Chance is the probability of the cluster's rows as a scene of this stratum would give
    them: its four kinds of paired outcome by a Dirichlet-multinomial fitted to the stratum's clusters
    (scenes differ -- a near-broken scene's 19 both-fail pairs and one both-succeed are common among
    near-broken scenes, rare among independent episodes), and each extra column that varies at random
    per episode (timestamps, episode ids, step counts) at its values' frequencies in the stratum. An
    extra column fixed by design -- the same values in most clusters, like seed indices 0..7 in every
    scene -- must match too but is no evidence. A repeat is flagged below DUPLICATE_CHANCE over the
    clusters of its size. Clusters never flagged: those whose rows are all identical (a broken scene
    that failed every episode the same way), and, where no extra column carries evidence, those whose
    outcomes are all alike (all-fail, all-pass: broken and trivial scenes repeat by nature). So a file
    with only the required columns can rarely show a copy, and per-episode columns make one stand out.

    rows: one stratum's rows with a cluster_id column and no scenario_id (a pandas DataFrame)."""
    import pandas as pd

    values = rows.drop(columns=["cluster_id", *([LABEL_COLUMN] if LABEL_COLUMN in rows.columns else [])]).astype(str)
    values = values.assign(baseline=values["baseline"] + "/" + values["candidate"]).drop(columns=["candidate"])
    clusters = rows["cluster_id"].to_numpy()
    extra = [c for c in values.columns if c not in OUTCOME_COLUMNS]
    random_extra = [c for c in extra if not fixed_by_design(values[c], clusters)]
    log_chance_of_row = np.zeros(len(rows))
    for column in random_extra:
        frequency = values[column].map(values[column].value_counts(normalize=True))
        log_chance_of_row += np.log(frequency.to_numpy(dtype=np.float64))
    frame = pd.DataFrame(
        {"cluster": clusters, "row": row_text(values).to_numpy(), "pair": values["baseline"].to_numpy(),
         "log_chance": log_chance_of_row}
    )  # fmt: skip
    grouped = frame.groupby("cluster", sort=False)
    fingerprints = grouped["row"].agg(lambda r: "\x1e".join(sorted(r)))
    never = (grouped["row"].nunique() == 1) | ((grouped["pair"].nunique() == 1) & (not random_extra))
    # P(rows) = P(the cluster's counts of each kind of pair) x (ways to give each kind its extra values)
    # x P(those values): the orderings are within a kind of pair, the kinds' own in the multinomial.
    from scipy.special import gammaln

    kinds = pd.crosstab(frame.cluster, frame.pair).reindex(fingerprints.index)
    counts = kinds.to_numpy(dtype=np.float64)
    multiplicity = frame.groupby(["cluster", "row"], sort=False).size()
    log_orderings = pd.Series(gammaln(counts + 1.0).sum(axis=1), kinds.index) - (
        pd.Series(gammaln(multiplicity.to_numpy(dtype=np.float64) + 1.0), multiplicity.index)
        .groupby(level=0, sort=False)
        .sum()
    )
    log_pairs = pd.Series(dirichlet_multinomial_logpmf(counts, fit_dirichlet_multinomial(counts)), kinds.index)
    log_chance = grouped["log_chance"].sum() + log_orderings + log_pairs
    sizes = grouped.size()
    same_size = sizes.map(sizes.value_counts())
    first_seen: Dict[str, str] = {}
    out: List[Tuple[str, str]] = []
    for cluster, fingerprint in fingerprints.items():
        if never[cluster]:
            continue
        if fingerprint not in first_seen:
            first_seen[fingerprint] = str(cluster)
        elif log_chance[cluster] + math.log(same_size[cluster]) < math.log(DUPLICATE_CHANCE):
            out.append((first_seen[fingerprint], str(cluster)))
    return out


def fixed_by_design(column: Any, clusters: np.ndarray) -> bool:
    """Whether an extra column's values are fixed by the evaluation's design rather than drawn per
    episode: at least half the clusters share their multiset of its values with another cluster."""
    multisets = column.groupby(clusters, sort=False).agg(lambda v: "\x1e".join(sorted(v)))
    return bool(multisets.duplicated(keep=False).mean() >= FIXED_BY_DESIGN_SHARE)


def row_text(values: Any) -> Any:
    """Each row of a frame of strings as one string (column-wise, so no Python call per row)."""
    columns = [values[c] for c in values.columns]
    text = columns[0]
    for column in columns[1:]:
        text = text + "\x1f" + column
    return text
