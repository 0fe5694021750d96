"""Structured-config schemas, registered in Hydra's ConfigStore.

`conf/config.yaml` lists `config_schema` first in its defaults, so every group file is merged
into a typed node: a misspelt key or a wrong type fails at compose time, before any work.
Checks that need more than a type (ranges, cross-references) live in each job's `validate`.
Importing this module must stay cheap: no mlflow, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf


class UserInputError(ValueError):
    """Bad input: reported as one line naming the problem and the fix, before any work starts."""


class DataLabel(str, Enum):
    REPLAYED = "REPLAYED"
    SIMULATED = "SIMULATED"
    COUNTERFACTUAL = "COUNTERFACTUAL"


class ClusterOrder(str, Enum):
    # The e-processes control the conditional mean given the past: clusters must come in random
    # order for the result to be about the stratum's mean (README "What Delta is").
    shuffled = "shuffled"  # a seeded random permutation of the source's clusters (the default)
    as_given = "as_given"  # the source's order, declared random by the user (recorded in lineage)


@dataclass
class JobConfig:
    name: str = "gauntlet"  # module under vlaeval/jobs/ that main.py dispatches to


@dataclass
class PathsConfig:
    # Jobs write here; the default is Hydra's run (or sweep job) directory. Reproduce overrides it.
    output_dir: str = "${hydra:runtime.output_dir}"
    cache_dir: str = "${oc.env:VLAEVAL_CACHE_DIR,.cache/vlaeval}"


@dataclass
class TrackingConfig:
    enabled: bool = True
    # null: $MLFLOW_TRACKING_URI if set, else sqlite:///<cwd>/mlflow.db (MLflow 3's own default).
    uri: Optional[str] = None
    experiment_prefix: str = "vlaeval"
    log_artifacts: bool = True
    # An unreachable server fails after this many retries / seconds a request (then job=sync).
    http_max_retries: int = 2
    http_timeout_s: int = 30


@dataclass
class StratumConfig:
    priority: int = 99  # lower runs first
    units: int = 1000
    base_rate: float = 0.9
    cluster_size: int = 20
    data_label: DataLabel = DataLabel.SIMULATED
    related: List[str] = field(default_factory=list)  # promoted when this stratum regresses
    kind: str = "global"  # "safety" strata get the stricter review margin in the recommendation
    catastrophic_halt: bool = False  # a certified catastrophic regression here halts the gauntlet
    margin_delta: Optional[float] = None  # null: gauntlet.margin_delta
    required: bool = False  # absent from the outcome source: NEEDS_REVIEW (else only reported)


@dataclass
class GauntletConfig:
    candidate_version: str = "candidate-v4"
    baseline_version: str = "baseline-v3"
    seed: int = 11
    alpha: float = 0.05
    margin_delta: float = 0.02
    catastrophic_delta: float = 0.05
    batch_units: int = 2000
    budget_units: int = 80_000
    nominal_stratum: str = "nominal"
    nominal_base_allowance: int = 8000
    nominal_expand_factor: float = 2.0
    critical_stratum: str = "safety_critical"
    # Clusters are evaluated in a seeded random order (order_seed, null: seed) unless the user
    # declares the source's order random (as_given); both are recorded in the lineage.
    cluster_order: ClusterOrder = ClusterOrder.shuffled
    order_seed: Optional[int] = None
    # The sequential test (README "What the e-process guarantees"; defaults chosen by
    # benchmarks/seqtest_efficiency.py).
    test_mode: str = "exact"  # exact betting e-processes; "asymptotic" and "group_sequential" are opt-in, labelled
    bet_rule: str = "blend"  # see vlaeval.seqtest.BET_RULES
    # Fraction c of the largest bet that keeps wealth non-negative on [-1, 1]; null: the
    # size-adaptive cap 1 - 0.2 / (the stratum's smallest planned cluster size), one per stratum.
    bet_cap: Optional[float] = None
    estimand: str = "cluster"  # "cluster": mean of cluster means; "unit": scenario-weighted mean
    alarm_fwer: str = "bonferroni"  # REGRESSION alarms at alpha / n_strata ("none": alpha each)
    burn_in_clusters: int = 30  # asymptotic mode only: no decision before this many clusters
    cs_grid_step: float = 0.001  # resolution of the confidence sequence; must divide every margin
    preflight: str = "warn"  # the planner before any unit is spent: warn | error | off
    assumed_effect: float = 0.0  # the planner's and pre-flight's assumed Delta
    plan_replications: int = 200  # simulated runs per stratum in the plan
    use_cache: bool = True
    require_clean_code: bool = False  # lineage invalid when the git tree has uncommitted changes
    plot: bool = True


@dataclass
class OutcomesConfig:
    _target_: str = "vlaeval.gauntlet.outcomes.SyntheticOutcomes"
    path: Optional[str] = None  # outcomes=file: CSV or Parquet of paired scenario outcomes
    # outcomes=file: "file" evaluates the strata the file holds (configured ones absent from it are
    # reported); "config" refuses a stratum the config lacks.
    strata: Optional[str] = None


DEFAULT_TASKS = ["reach-v3", "push-v3", "pick-place-v3", "peg-insert-side-v3", "disassemble-v3", "stick-pull-v3"]


@dataclass
class DataConfig:
    name: str = "metaworld"
    # Easy tasks mixed with ones whose scripted experts themselves fail now and then, so that
    # evaluations can tell two policies apart.
    tasks: List[str] = field(default_factory=lambda: list(DEFAULT_TASKS))
    episodes_per_task: int = 12
    max_steps: int = 150
    action_noise: float = 0.1  # std of the seeded perturbation of executed expert actions
    seed: int = 0
    horizon: int = 4  # H: the target chunk is the next H expert actions


@dataclass
class ModelConfig:
    _target_: str = "vlaeval.policy.TinyVLA"
    encoder_hidden: int = 256
    conditioning_dim: int = 128
    head_hidden: int = 256
    head_layers: int = 3
    time_embedding_dim: int = 32


@dataclass
class FlowConfig:
    # openpi convention: t ~ Beta(beta_a, beta_b) * time_scale + time_offset, t = 1 is noise.
    beta_a: float = 1.5
    beta_b: float = 1.0
    time_scale: float = 0.999
    time_offset: float = 0.001
    sampling_steps: int = 10  # Euler steps when acting


@dataclass
class TrainConfig:
    steps: int = 3000
    batch_size: int = 256
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0
    log_every: int = 50
    evaluate_after: bool = True


@dataclass
class CheckpointConfig:
    kind: str = "builtin"  # builtin: train on first use, cached by config hash; path: use `path`
    path: Optional[str] = None


@dataclass
class EvaluateConfig:
    episodes_per_task: int = 5
    seed: int = 1
    execute_actions: int = 1  # actions of each sampled chunk executed before re-planning
    max_steps: int = 150


@dataclass
class GradientsConfig:
    num_anchors: int = 64
    # 512 seeds: the split-half reliability of gradient RMS measured 0.65 / 0.76 / 0.82 with
    # 128 / 256 / 384 seeds on the default policy (benchmarks/per_sample_gradients.py).
    seeds: List[int] = "${range:5000,5512}"  # type: ignore[assignment]
    trainable: str = "action_head"  # or "all"
    batch_size: int = 4096  # (anchor, seed) pairs per backward pass
    epoch: int = 0


@dataclass
class EstimatorConfig:
    kind: str = "sobol"  # iid | midpoint_antithetic | stratified | sobol (vlaeval.residual.estimators)
    # M: (t, eps) draws per anchor and estimator seed. With 4 seeds, 256 head evaluations per
    # anchor: enough for sobol to rank anchors as well as 512 iid samples (benchmarks/residual_audit.py).
    samples_per_estimator: int = 64
    seeds: List[int] = field(default_factory=lambda: [9300, 9301, 9302, 9303])
    anchor_batch_size: int = 64  # anchors scored per forward pass of the action head


@dataclass
class AuditConfig:
    gradient_artifact: Optional[str] = None  # null: build (and cache) one for the builtin checkpoint
    alpha: float = 0.2  # uniform mixing of the proposal
    percentile_epsilon: float = 0.1  # winsorisation of the scores
    proposal_power: float = 0.5  # gamma: weights = winsorised score ** gamma
    permutations: int = 10_000
    permutation_seed: int = 9100
    plot: bool = True


@dataclass
class GateConfig:
    name: str = "formal"
    min_anchors: int = 64
    formal_min_anchors: int = 64  # fewer anchors: "smoke, not a gate certificate"
    repeatability_spearman: float = 0.90
    score_gradient_spearman: float = 0.50
    permutation_p: float = 0.01
    top25_overlap: float = 0.50
    second_moment_ratio: float = 0.98
    second_moment_permutation_p: float = 0.01
    leave_one_out: bool = True
    # The score must beat the training loss (higher Spearman and lower second-moment ratio, both on
    # draws independent of the gradient RMS): required in gate=strict, informational otherwise.
    require_beating_training_loss: bool = False


@dataclass
class ReproduceConfig:
    run_id: Optional[str] = None  # an MLflow run id, or a local run directory
    job_overrides: List[str] = field(default_factory=list)  # applied on top of the saved config


@dataclass
class HistoryConfig:
    limit: int = 20


@dataclass
class SyncConfig:
    # Folders searched (recursively) for runs spooled while the tracking store was unreachable.
    paths: List[str] = field(default_factory=lambda: ["outputs", "multirun_sweeps"])


@dataclass
class VlaevalConfig:
    job: JobConfig = field(default_factory=JobConfig)
    device: str = "cpu"
    paths: PathsConfig = field(default_factory=PathsConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    gauntlet: GauntletConfig = field(default_factory=GauntletConfig)
    strata: Dict[str, StratumConfig] = field(default_factory=dict)
    effects: Dict[str, float] = field(default_factory=dict)
    outcomes: OutcomesConfig = field(default_factory=OutcomesConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    gradients: GradientsConfig = field(default_factory=GradientsConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    reproduce: ReproduceConfig = field(default_factory=ReproduceConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)


def register_configs() -> None:
    ConfigStore.instance().store(name="config_schema", node=VlaevalConfig)
    # ${range:5000,5256} -> [5000, ..., 5255]: long seed lists on the command line.
    OmegaConf.register_new_resolver("range", lambda start, stop: list(range(int(start), int(stop))), replace=True)


register_configs()


def require(condition: bool, message: str) -> None:
    """Raise a one-line UserInputError unless `condition` holds."""
    if not condition:
        raise UserInputError(message)


def to_plain(cfg: Any) -> Any:
    """Resolved plain-Python view of an OmegaConf node (enums as their names)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
