"""Structured-config schemas, registered in Hydra's ConfigStore: the one place defaults live.

The rule (docs/architecture.md): a schema dataclass here carries every setting's type and default;
a `_target_` component's schema is generated from its constructor's signature
(vlaeval.components); an option file in conf/ names only what differs from the schema, with a
comment saying why. Closed choice sets are Enums (vlaeval.choices), so a value outside the set fails
when Hydra composes the config; so does a misspelt key or a wrong type. Checks that need more than
a type (ranges, cross-references) live in each job's validation, before any work.
Importing this module must stay cheap: no mlflow, no torch, no numpy.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, TypeVar, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from vlaeval.choices import (
    DEFAULT_BET_RULE,
    DEFAULT_ORDERS,
    AblationProposal,
    AlarmFwer,
    AnchorSampling,
    BetRule,
    CheckpointKind,
    ClusterOrder,
    DataLabel,
    Estimand,
    EstimatorKind,
    Executor,
    GradientMethod,
    HaltRule,
    NoiseEnd,
    OfflineMetric,
    Optimizer,
    Preflight,
    Question,
    StratumKind,
    TestMode,
    TimeDistribution,
    TimeSampling,
    TimeSignal,
    TrainableSubset,
    VelocityTarget,
)
from vlaeval.errors import UserInputError, require

__all__ = [
    "ClusterOrder",
    "Component",
    "DataLabel",
    "GauntletConfig",
    "JobSettings",
    "StratumConfig",
    "UserInputError",
    "VlaevalConfig",
    "check_known_keys",
    "register_configs",
    "require",
    "to_plain",
    "typed_job_config",
]


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
    # The store runs are recorded in: a backend registered by name in vlaeval.tracking.store.RUN_STORES.
    backend: str = "mlflow"
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
    kind: StratumKind = StratumKind.general  # a label carried to the report and the recommendation's reasons
    catastrophic_halt: bool = False  # a certified catastrophic regression here halts the gauntlet
    margin_delta: Optional[float] = None  # null: gauntlet.margin_delta
    required: bool = False  # absent from the outcome source: NEEDS_REVIEW (else only reported)
    # The largest / smallest cluster this stratum's scenarios can produce, declared before the test.
    # For an outcome file, estimand=unit needs max_cluster_size (the weights' normaliser may not be the
    # file's own largest cluster); min_cluster_size fixes the bet cap (unset: a running minimum).
    # Synthetic and rollout sources take both from their scenario plan unless declared.
    max_cluster_size: Optional[int] = None
    min_cluster_size: Optional[int] = None


@dataclass
class GauntletConfig:
    # The versions compared; "": the source's own names (an outcome file's baseline_version and
    # candidate_version columns, the rollouts' checkpoint digests, the synthetic generator's
    # demonstration names), else the roles "baseline" and "candidate" -- never a name made up.
    candidate_version: str = ""
    baseline_version: str = ""
    seed: int = 11
    alpha: float = 0.05
    # What each stratum is asked (vlaeval.choices.Question, vlaeval/gauntlet/question.py): a launch's
    # non-inferiority at margin_delta (the default), "is the candidate better?" (superiority: Delta >
    # superiority_gain certified, or its opposite), or "which is better?" (two_sided, each direction at
    # alpha). A comparison is not a launch: no halt, no blocker, a conclusion instead of a recommendation.
    question: Question = Question.non_inferiority
    superiority_gain: float = 0.0
    margin_delta: float = 0.02
    # 0.05, not the prototype's 0.03 (whose margin was 0.005): three points beyond the 0.02 margin, so
    # a halting stratum can tell a catastrophic regression from a plain one within its units; a gap
    # of one point would need about 1/0.01 * log(1/alpha_cat) ~ 500 clusters (job=plan shows it).
    catastrophic_delta: float = 0.05
    # When a halting stratum stops the candidate (vlaeval.choices.HaltRule): the prototype's rule by
    # default -- a certified REGRESSION whose estimate lies beyond -catastrophic_delta.
    halt_rule: HaltRule = HaltRule.regression_beyond_margin
    batch_units: int = 2000
    budget_units: int = 80_000
    nominal_stratum: str = "nominal"
    nominal_base_allowance: int = 8000
    nominal_expand_factor: float = 2.0
    critical_stratum: str = "safety_critical"
    # Clusters are evaluated in a random order unless the user declares the source's order random
    # (as_given). Outcomes that all exist (a file) are tested order-free: the average over `orders`
    # fixed orders seeded from the clusters themselves (vlaeval/seqtest/order_free.py), so order_seed
    # is refused there; otherwise order_seed null is a fresh draw for rollouts and `seed` for
    # generated outcomes (vlaeval/gauntlet/constants.py); recorded per stratum.
    cluster_order: ClusterOrder = ClusterOrder.shuffled
    order_seed: Optional[int] = None
    orders: int = DEFAULT_ORDERS  # fixed orders averaged on a file (benchmarks/certified_decisions.py, section 7)
    # Each outcome-file stratum's tested evidence is recorded under <paths.cache_dir>/gauntlet-ledger; a
    # later run on a file that repeats or extends it continues that test (vlaeval/gauntlet/ledger.py).
    evidence_ledger: bool = True
    # Rollouts only: side-by-side videos (baseline | candidate) of up to this many paired episodes the
    # candidate failed and the baseline passed, unsafe ones first, re-run from their seeds after the
    # test and logged as artifacts (vlaeval/rollouts/videos.py); 0: none.
    videos: int = 0
    # Source strata accepted as new although their names are one or two edits from a configured
    # stratum (otherwise refused as a likely typo: "did you mean ...").
    accept_new_strata: List[str] = field(default_factory=list)
    # The sequential test (docs/gauntlet.md "What the e-process guarantees"; defaults chosen by
    # benchmarks/seqtest_efficiency.py).
    test_mode: TestMode = TestMode.exact  # asymptotic and group_sequential are opt-in and labelled
    # A stream's bet (rollouts, generated outcomes, as_given files); a file's orders bet the
    # fixed-horizon plug-in, their size being known before their first cluster (seqtest/order_free.py).
    bet_rule: BetRule = DEFAULT_BET_RULE
    # Fraction c of the largest bet that keeps wealth non-negative on [-1, 1]; null: the
    # size-adaptive cap 1 - 0.2 / (the stratum's smallest planned cluster size), one per stratum.
    bet_cap: Optional[float] = None
    estimand: Estimand = Estimand.cluster  # cluster: mean of cluster means; unit: scenario-weighted mean
    alarm_fwer: AlarmFwer = AlarmFwer.bonferroni  # alarms (REGRESSION, halts) at alpha / (K + H); none: alpha each
    burn_in_clusters: int = 30  # the approximate modes decide nothing before this many clusters
    cs_grid_step: float = 0.001  # resolution of the confidence sequence; must divide every margin
    preflight: Preflight = Preflight.warn  # the planner before any unit is spent
    assumed_effect: float = 0.0  # the planner's and pre-flight's assumed Delta
    plan_replications: int = 200  # simulated runs per stratum in the plan
    use_cache: bool = True
    require_clean_code: bool = False  # lineage invalid when the git tree has uncommitted changes
    plot: bool = True
    # A CI launch gate: exit 0 for LAUNCH, 10 for NEEDS_REVIEW, 11 for DO_NOT_LAUNCH (README "Exit codes").
    exit_code_from_recommendation: bool = False


@dataclass
class FlowConfig:
    """The policy's flow-matching convention (vlaeval/policy/flow.py); the defaults are openpi's:
    t = 1 is noise, the velocity predicts eps - a, t ~ Beta(1.5, 1) * 0.999 + 0.001."""

    noise_at: NoiseEnd = NoiseEnd.one
    velocity_target: VelocityTarget = VelocityTarget.noise_minus_action
    time_distribution: TimeDistribution = TimeDistribution.beta
    beta_a: float = 1.5
    beta_b: float = 1.0
    logit_mean: float = 0.0  # logit_normal only
    logit_std: float = 1.0
    time_scale: float = 0.999
    time_offset: float = 0.001
    sampling_steps: int = 10  # Euler steps when acting


@dataclass
class TrainConfig:
    steps: int = 3000
    batch_size: int = 256
    learning_rate: float = 1e-3  # the peak of a cosine schedule to zero at `steps`
    weight_decay: float = 0.0
    # The recipe image policies train with (Diffusion Policy, DP3), on for every built-in policy: the
    # learning rate rises linearly over warmup_steps before the cosine (a run no longer than the warmup
    # only rises); each step's gradient is clipped to grad_clip_norm (null: no clipping); an exponential
    # moving average of the weights (ema_decay, ramped up as min(ema_decay, (1 + step) / (10 + step)))
    # is what the held-out loss reads, what is evaluated and what the checkpoint holds (null: the last
    # weights). 0, null, null train as before these existed, under the keys those checkpoints had.
    # Measured in benchmarks/vision_ablations.py (the vision and the state policy, with and without).
    warmup_steps: int = 200
    grad_clip_norm: Optional[float] = 1.0
    ema_decay: Optional[float] = 0.999
    # torch's intra-op threads while training; 0: one for a model whose training step is under 2 GFLOP
    # (the MLP and transformer policies), every available core above (vlaeval/policy/threads.py).
    threads: int = 0
    # (t, noise) draws per anchor in a minibatch: batch_size / draws_per_anchor anchors, each encoded
    # once and its conditioning reused for every draw. An image policy's encoder is most of its step, so
    # 4 makes the vision policy's step 6-8x faster at the same batch of pairs (docs/figures/vision_speed.md;
    # what it costs in success: benchmarks/vision_ablations.py); 1 draws every pair's anchor
    # independently, as before this existed.
    draws_per_anchor: int = 1
    optimizer: Optimizer = Optimizer.adamw
    momentum: float = 0.9  # optimizer=sgd only (heavy-ball momentum)
    seed: int = 0
    log_every: int = 50
    evaluate_after: bool = True
    # Flow time from the training distribution (uniform), or over time_bins equal-probability bins drawn
    # with p_k ~ sqrt(moving average of each bin's time_signal) mixed with time_floor of uniform, each
    # loss weighted by (1 / K) / p_k so the objective stays the policy's own (vlaeval/policy/time_sampling.py).
    time_sampling: TimeSampling = TimeSampling.uniform
    time_signal: TimeSignal = TimeSignal.loss
    time_bins: int = 16
    time_decay: float = 0.98  # the moving average's weight on the past, per step
    time_floor: float = 0.2  # no weight above 1 / time_floor
    time_warmup_steps: int = 20
    # Anchors drawn uniformly, or from the audit's proposal (audit.alpha, percentile_epsilon,
    # proposal_power) over the residual of every anchor, scored (estimator.*) by the model training
    # starts from; the scoring time is charged to the run's clock.
    anchor_sampling: AnchorSampling = AnchorSampling.uniform
    init_from: Optional[str] = None  # a weights-only checkpoint to start from (e.g. an early one)
    # The held-out flow-matching loss (the data's held-out scenes, heldout_episodes_per_task episodes,
    # heldout_draws fixed draws per anchor) every heldout_every steps, against the run's clock (0: off).
    heldout_every: int = 0
    heldout_episodes_per_task: int = 4
    heldout_draws: int = 4
    # The held-out curve's scenes (held_out: all of them; test: the second half), and a second curve,
    # the one a learning-rate grid chooses on, on scenes disjoint from the first (validation: the first
    # half; null: none): what is chosen is never what is reported (vlaeval/envs/episodes.py).
    heldout_scenes: str = "held_out"
    validation_scenes: Optional[str] = None
    # The realised second-moment ratio of what the run draws from (its anchor proposal x the adaptive
    # sampler's flow-time bins as they stand) against uniform draws: exact per-sample gradient norms
    # (every trainable parameter, the online weights) of this many fixed training anchors, one fixed
    # draw each, at every held-out step (0: off). Below 1 the sampler is buying a larger effective batch.
    second_moment_anchors: int = 0
    # A compute budget instead of train.steps (null: train.steps): the run ends when it has spent this
    # many training pairs -- one (anchor, t, noise) forward and backward -- and its schedule ends there
    # with it. Scoring the anchors for anchor_sampling=residual is charged at its counted FLOPs, so
    # every arm of a comparison ends at the same compute: 1.5x the batch gets 2/3 of the steps, the
    # residual arm loses what it spent scoring.
    budget_samples: Optional[int] = None
    # A checkpoint every save_every steps besides the last (0: none), in the run folder's
    # snapshots/step_<N>/model.pt with its sidecar: the weights evaluation would read at that step
    # (the moving average where there is one), for job=offline_validity and checkpoint selection.
    save_every: int = 0
    # A first-use training of a built-in checkpoint keeps its state (weights, optimizer, generators)
    # in its cache entry every this many seconds of its clock, so a killed run continues from there to
    # the weights an uninterrupted one ends with (vlaeval/policy/training.py: LoopState).
    resume_every_s: float = 60.0


@dataclass
class CheckpointConfig:
    kind: CheckpointKind = CheckpointKind.builtin  # builtin: train on first use, cached by config hash; path: `path`
    path: Optional[str] = None


@dataclass
class EvaluateConfig:
    episodes_per_task: int = 5
    seed: int = 1
    # Which of the simulator's held-out scenes: all of them, or the half a learning-rate grid does not
    # choose on (test; validation is the other half: train.validation_scenes, vlaeval/envs/episodes.py).
    scenes: str = "held_out"
    execute_actions: int = 1  # actions of each sampled chunk executed before re-planning
    max_steps: int = 150
    # An episode ends when the goal is first reached (any-step success, Meta-World's criterion); with
    # run_to_horizon every episode runs its max_steps and success at the last step is reported beside
    # it (final-step success: did the policy keep the goal, as LIBERO and end-state benchmarks judge).
    run_to_horizon: bool = False
    # Probes run on the very same episodes besides the clean run: {name: {perturbation: {...},
    # instructions: task|paraphrase|unseen|other_task}} (vlaeval/rollouts/evaluation.py). What a
    # policy does with its camera blanked or another task's instruction shows whether it sees and reads.
    conditions: Dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutConfig:
    """Where and how fast closed-loop episodes run, wherever they run -- job=evaluate, job=train's
    evaluation, the ablation's closed loop, outcomes=rollout -- and never what they give: an
    episode's outcome depends on the episode alone (vlaeval/rollouts/engine.py), so these change only
    the speed. What an episode is (its steps, the actions executed per chunk) belongs to what it
    evaluates: evaluate.* for the held-out evaluation, the scenario families' source for rollouts."""

    lockstep_group: int = 32  # episodes advanced together, one batched policy call per control step
    workers: int = 2  # processes (executor=local) or concurrent Ray tasks (executor=ray)
    # ray_address: null starts a local Ray instance for the run; "auto" joins the running cluster;
    # ray://host:10001 a remote one.
    executor: Executor = Executor.local
    ray_address: Optional[str] = None


@dataclass
class GradientsConfig:
    num_anchors: int = 64
    # 512 seeds: the split-half reliability of gradient RMS measured 0.65 / 0.76 / 0.82 with
    # 128 / 256 / 384 seeds on the default policy (benchmarks/per_sample_gradients.py).
    seeds: List[int] = "${range:5000,5512}"  # type: ignore[assignment]
    trainable: TrainableSubset = TrainableSubset.action_head
    # Glob patterns over the policy's parameter names (named_parameters) that narrow `trainable` to
    # the parameters they match, e.g. [expert.*] for the VLA's action expert under trainable=all; empty:
    # all of `trainable`. The artifact records the selection and every name it covers.
    parameters: List[str] = field(default_factory=list)
    batch_size: int = 4096  # (anchor, seed) pairs per backward pass
    epoch: int = 0
    # Exact per-sample norms (vlaeval/residual/gradients.py); the artifact records each layer's method.
    method: GradientMethod = GradientMethod.auto
    verify_pairs: int = 8  # pairs checked against the per-sample loop before the artifact is trusted

    def selection(self) -> str:
        """The parameters the norms cover, as one string (`trainable`, then `:` and the patterns when
        there are any): what the artifact records and the ablation compares and fine-tunes."""
        patterns = [str(p) for p in self.parameters]
        return str(self.trainable) + (":" + ",".join(patterns) if patterns else "")


@dataclass
class EstimatorConfig:
    kind: EstimatorKind = EstimatorKind.sobol  # see vlaeval.residual.estimators
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
    # Equal-probability flow-time bins of the gradient second moment's decomposition over anchor, flow time
    # and the rest (vlaeval/audit/decomposition.py); made when the artifact records each draw's flow time.
    decomposition_bins: int = 10
    permutations: int = 10_000
    permutation_seed: int = 9100
    plot: bool = True
    # A CI gate: exit 0 when the gate passes formally, 12 when a check fails, 13 for a smoke run (too
    # few anchors for a certificate) -- README "Exit codes".
    exit_code_from_gate: bool = False


@dataclass
class ScoreConfig:
    """job=score: per-anchor residual scores of every training anchor, shard by shard."""

    shard_index: int = 0
    shard_count: int = 1  # anchors split into this many contiguous ranges (a multirun over shard_index)
    merge: Optional[str] = None  # a folder of shards (e.g. the sweep's): check and join them instead


@dataclass
class AblationConfig:
    """job=ablation: fine-tune the audited checkpoint under each proposal (docs/audit.md "The 500-step ablation")."""

    proposals: List[AblationProposal] = field(
        default_factory=lambda: [
            AblationProposal.uniform,
            AblationProposal.residual,
            AblationProposal.training_loss,
            AblationProposal.gradient_oracle,
            AblationProposal.flow_time,
            AblationProposal.residual_flow_time,
            AblationProposal.adaptive_flow_time,
        ]
    )
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])  # training seeds, each run per proposal
    steps: int = 500
    batch_size: int = 256
    learning_rate: float = 1e-4  # constant; the built-in policy ended its cosine schedule from 1e-3
    optimizer: Optimizer = Optimizer.adamw
    # The gradient's second moment at steps 0, measure_every, ..., steps: every anchor with
    # judge_draws fresh flow draws each (never used to build a proposal), and `minibatches` real
    # minibatch gradients of each proposal and of uniform sampling at the same parameters.
    measure_every: int = 250
    judge_draws: int = 8
    minibatches: int = 32
    # Draws per anchor the training-loss, gradient-oracle and flow-time proposals are built from.
    build_draws: int = 16
    time_bins: int = 10  # equal-probability bins of the training flow-time distribution
    time_alpha: float = 0.1  # uniform mixing of the flow-time proposal
    # Held-out flow-matching loss every heldout_every steps: the data's held-out scenes
    # (data.scenes=held_out), heldout_episodes_per_task episodes, heldout_draws fixed draws per anchor.
    heldout_every: int = 50
    heldout_episodes_per_task: int = 4
    heldout_draws: int = 4
    evaluate: bool = True  # closed-loop success after fine-tuning on the evaluate.* episodes
    # A job=residual_audit result.json: its predicted ratio and gate. Refused when its gate failed, unless
    # allow_failed_gate (e.g. to measure how often a failed gate was right), or when it was audited under
    # other settings (proposal, estimator, gradient subset, checkpoint, dataset) than this run's.
    audit_result: Optional[str] = None
    allow_failed_gate: bool = False
    scores: Optional[str] = None  # job=score's scores.json or shard folder (null: score every anchor here)
    plot: bool = True


@dataclass
class RecipeConfig:
    """One recipe of job=recipe_comparison: its name and its overrides of the sections that decide a
    built-in policy's weights (model.*, data.*, flow.*, train.*; vlaeval/recipes/spec.py)."""

    name: str = "recipe"
    overrides: List[str] = field(default_factory=list)
    # Seed pair k trains this recipe with train.seed = recipes.first_seed + k + seed_offset: an A/A
    # (the same recipe twice) needs another offset on one side, or both sides are one checkpoint.
    seed_offset: int = 0


@dataclass
class RecipesConfig:
    """job=recipe_comparison: is the candidate recipe better than the baseline over training seeds
    (docs/recipes.md)? Checked once, when the job's config is typed."""

    baseline: RecipeConfig = field(default_factory=lambda: RecipeConfig(name="baseline"))
    candidate: RecipeConfig = field(default_factory=lambda: RecipeConfig(name="candidate"))
    # Seed pair k trains both recipes with train.seed = first_seed + k; pairs are added until the test
    # decides or max_seeds pairs have run (each pair is two training runs: the expensive unit).
    first_seed: int = 0
    max_seeds: int = 10
    # The test over seed pairs (vlaeval/seqtest/seeds.py): its level; the margin in success points
    # inside which the recipes are EQUIVALENT (0: never certified); the standardised effect's prior
    # variance g (2: tuned for differences of 1-3 seed-pair SDs; the planner shows what it costs).
    alpha: float = 0.05
    margin: float = 0.05
    prior_scale: float = 2.0
    # Decide from an outcome file with a seed column (what a comparison writes: seed_outcomes.csv)
    # instead of training: the same test on the same seed pairs.
    file: Optional[str] = None
    # The planner: seed pairs needed for these differences (success points), at this seed-pair SD
    # (null: the SD the comparison measured).
    plan_effects: List[float] = field(default_factory=lambda: [0.05, 0.1, 0.2])
    plan_sd: Optional[float] = None

    def __post_init__(self) -> None:
        require(
            self.baseline.name != self.candidate.name,
            f"recipes.baseline.name and recipes.candidate.name are both {self.baseline.name!r}; give them different names",
        )
        require(self.first_seed >= 0, f"recipes.first_seed={self.first_seed} must be >= 0")
        require(
            self.max_seeds >= 2,
            f"recipes.max_seeds={self.max_seeds} must be >= 2 (one pair says nothing about the spread)",
        )
        require(0.0 < self.alpha < 1.0, f"recipes.alpha={self.alpha} must be in (0, 1)")
        require(0.0 <= self.margin < 1.0, f"recipes.margin={self.margin} must be in [0, 1) (success points)")
        require(self.prior_scale > 0.0, f"recipes.prior_scale={self.prior_scale} must be > 0")
        require(
            all(-1.0 < e < 1.0 for e in self.plan_effects),
            f"recipes.plan_effects={list(self.plan_effects)} must be success differences in (-1, 1)",
        )
        require(self.plan_sd is None or self.plan_sd > 0.0, f"recipes.plan_sd={self.plan_sd} must be > 0 (or null)")


@dataclass
class ValidityConfig:
    """job=offline_validity: does an offline metric rank checkpoints the way closed-loop success does
    (docs/offline_validity.md)?"""

    # The checkpoints of one policy family: job=train's model.pt files, or folders searched
    # recursively for them (a multirun's sweep folder: one model.pt per run).
    checkpoints: List[str] = field(default_factory=list)
    metrics: List[OfflineMetric] = field(
        default_factory=lambda: [
            OfflineMetric.heldout_loss,
            OfflineMetric.heldout_loss_by_time,
            OfflineMetric.action_error,
            OfflineMetric.residual_mean,
            OfflineMetric.audit_ratio,
        ]
    )
    # The held-out loss and sampled-action error read the data's held-out scenes
    # (data.scenes=held_out, heldout_episodes_per_task each), heldout_draws fixed draws per anchor,
    # and time_bins equal bins of the noise level.
    heldout_episodes_per_task: int = 4
    heldout_draws: int = 4
    time_bins: int = 4
    # The residual's mean and the audit's ratio: `anchors` fixed training anchors, the estimator
    # section's estimator, gradient RMS over gradient_seeds (the audit's proposal: the audit section).
    anchors: int = 64
    gradient_seeds: List[int] = field(default_factory=lambda: list(range(100, 108)))
    # Also compare within the groups of checkpoints alike in one setting they differ in (e.g.
    # trained_steps: the snapshots trained equally long; train.learning_rate), each group its own scope.
    within: Optional[str] = None
    # Bootstrap over checkpoints and (paired) episodes.
    level: float = 0.95
    resamples: int = 2000
    seed: int = 0
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
    # The three-way verdict on the ratio (vlaeval/audit/verdict.py): PASS when the interval's upper
    # end is below second_moment_ratio, FAIL when its lower end is above, UNDECIDED between; the
    # interval a two-level bootstrap (anchors, and gradient seeds within each) at verdict_level.
    verdict_level: float = 0.95
    verdict_resamples: int = 2000
    # The break-even ratio r* = 1 / (1 + C_score / C_train) weighs scoring the dataset's anchors once
    # against the training run the train section plans (steps x batch x draws), both in counted FLOPs.


@dataclass
class ExportConfig:
    root: Optional[str] = None  # null: <run directory>/lerobot
    fps: int = 80  # Meta-World steps its controller at 80 Hz (frame_skip 5 x 2.5 ms)
    robot_type: Optional[str] = "sawyer"
    # Cameras are written as video the way LeRobot writes them (vlaeval/data/cameras.py: VideoEncoding):
    # libsvtav1 (AV1, LeRobot's default) or libx264 (H.264); yuv420p; a keyframe every `video_gop` frames.
    video_codec: str = "libsvtav1"
    video_crf: int = 30
    video_gop: int = 2


@dataclass
class ReproduceConfig:
    run_id: Optional[str] = None  # an MLflow run id, or a local run directory
    job_overrides: List[str] = field(default_factory=list)  # applied on top of the saved config
    # Set by job=reproduce on the re-run it dispatches, not by hand: the original rollout gauntlet's
    # freshly drawn cluster-order seed, replayed (not part of the config digest).
    replay_order_seed: Optional[int] = None
    # `_target_` prefixes besides vlaeval.'s own that a saved config may name (your own components).
    trusted_targets: List[str] = field(default_factory=list)


@dataclass
class HistoryConfig:
    limit: int = 20  # newest runs listed
    run_id: Optional[str] = None  # show this run in full: a vlaeval run id or an MLflow run id
    candidate_version: Optional[str] = None  # list only runs of this candidate
    recommendation: Optional[str] = None  # list only LAUNCH, DO_NOT_LAUNCH or NEEDS_REVIEW runs
    # Folders searched for runs MLflow does not have (tracking disabled, or queued for job=sync).
    local_paths: List[str] = field(default_factory=lambda: ["outputs", "multirun_sweeps"])


@dataclass
class RegressionsConfig:
    # job=regressions: side-by-side videos (baseline | candidate) of up to this many registry scenarios
    # that outcomes=rollout's baseline and candidate recorded, re-run from their seeds (0: list only).
    videos: int = 0


@dataclass
class SyncConfig:
    # Folders searched (recursively) for runs spooled while the tracking store was unreachable.
    paths: List[str] = field(default_factory=lambda: ["outputs", "multirun_sweeps"])
    # A queued run goes to the store it was queued for; true: to the configured store instead.
    to_configured_store: bool = False


@dataclass
class VlaevalConfig:
    job: JobConfig = field(default_factory=JobConfig)
    device: str = "cpu"
    # Where closed-loop episodes run: a simulator registered by name in vlaeval/envs (SIMULATORS).
    simulator: str = "metaworld"
    paths: PathsConfig = field(default_factory=PathsConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    gauntlet: GauntletConfig = field(default_factory=GauntletConfig)
    strata: Dict[str, StratumConfig] = field(default_factory=dict)
    # Per stratum: a success-rate difference (synthetic outcomes) or a degradation of the candidate
    # (rollouts: a perturbation mapping); each source refuses what it cannot plant.
    effects: Dict[str, Any] = field(default_factory=dict)
    # `_target_` components: each option's schema comes from its target's signature
    # (vlaeval.components); a user's own component is checked against its signature at start.
    outcomes: Any = field(default_factory=dict)
    data: Any = field(default_factory=dict)
    model: Any = field(default_factory=dict)
    flow: FlowConfig = field(default_factory=FlowConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    gradients: GradientsConfig = field(default_factory=GradientsConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    reproduce: ReproduceConfig = field(default_factory=ReproduceConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    regressions: RegressionsConfig = field(default_factory=RegressionsConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    validity: ValidityConfig = field(default_factory=ValidityConfig)
    recipes: RecipesConfig = field(default_factory=RecipesConfig)


def register_configs() -> None:
    from vlaeval.components import register_builtin_components

    ConfigStore.instance().store(name="config_schema", node=VlaevalConfig)
    register_builtin_components()
    # ${range:5000,5256} -> [5000, ..., 5255]: long seed lists on the command line.
    OmegaConf.register_new_resolver("range", lambda start, stop: list(range(int(start), int(stop))), replace=True)


register_configs()


def job_config(cfg: DictConfig, sections: Sequence[str]) -> DictConfig:
    """The run's config cut to `sections` (and the shared ones), typed and in struct mode: what the
    job is given, logs and digests. A job that reads a section it did not declare fails in the
    tests with "Missing key", rather than silently depending on a setting its runs do not record."""
    keep = [name for name in SHARED_SECTIONS + tuple(sections) if name in cfg]
    cut = OmegaConf.masked_copy(cfg, list(dict.fromkeys(keep)))
    OmegaConf.set_struct(cut, True)
    return cut


def to_plain(cfg: Any) -> Any:
    """Resolved plain-Python view of an OmegaConf node, a section's dataclass or a job's typed config
    (enums as their names): what is logged and digested, the same for a node and its typed form."""
    if isinstance(cfg, JobSettings):
        # In the composed config's order (VlaevalConfig's), so a run's digest does not depend on
        # the order a job's dataclass declares its sections in.
        present = {f.name for f in fields(cfg) if getattr(cfg, f.name) is not None}
        return {f.name: to_plain(getattr(cfg, f.name)) for f in fields(VlaevalConfig) if f.name in present}
    if is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = OmegaConf.structured(cfg)
    if isinstance(cfg, dict):
        return {key: to_plain(value) for key, value in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_plain(value) for value in cfg]
    if not OmegaConf.is_config(cfg):
        return cfg.name if isinstance(cfg, Enum) else cfg
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


# The tracking section as a job's typed config holds it, or as Hydra's callbacks see the composed
# config (a sweep's parent run).
TrackingSection = TrackingConfig | DictConfig


# A `_target_` component's config (data, model, outcomes), kept as its read-only node: its keys are
# its target's arguments (checked against the signature before the job starts), built with
# hydra.utils.instantiate; there is no dataclass to convert it to.
Component = DictConfig


@dataclass(frozen=True, kw_only=True)
class JobSettings:
    """What every job is given: the base of each job's typed config. A job module's `run` is
    annotated with its subclass (`def run(cfg: GauntletJobConfig)`), whose fields are the config
    sections the job reads -- the only ones it is given, logs and digests; a field that defaults to
    None is read only when present (a gauntlet whose outcome source runs policies)."""

    job: JobConfig
    paths: PathsConfig
    tracking: TrackingConfig


S = TypeVar("S", bound=JobSettings)


@dataclass(frozen=True, kw_only=True)
class PolicyJobSettings(JobSettings):
    """The sections building, loading or running a policy reads: the base of the jobs that train,
    score or run one."""

    data: Component
    model: Component
    flow: FlowConfig
    train: TrainConfig
    checkpoint: CheckpointConfig
    evaluate: EvaluateConfig
    rollout: RolloutConfig
    device: str
    simulator: str


@dataclass(frozen=True, kw_only=True)
class SourceJobSettings(JobSettings):
    """The sections a job over an outcome source reads (job=plan, gauntlet, regressions); a source that
    runs policies (outcomes=rollout: its constructor takes a `context`) also reads the policy
    sections, which are None otherwise (the job is not given them)."""

    outcomes: Component
    data: Optional[Component] = None
    model: Optional[Component] = None
    flow: Optional[FlowConfig] = None
    train: Optional[TrainConfig] = None
    checkpoint: Optional[CheckpointConfig] = None
    evaluate: Optional[EvaluateConfig] = None
    rollout: Optional[RolloutConfig] = None
    device: Optional[str] = None
    simulator: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class OutcomeJobSettings(SourceJobSettings):
    """What testing a source's strata reads (job=plan, job=gauntlet)."""

    gauntlet: GauntletConfig
    strata: Dict[str, StratumConfig]
    effects: Dict[str, Any]


def job_sections(schema: Type[JobSettings], *, optional: bool = False) -> Tuple[str, ...]:
    """The sections a job's config reads besides the shared ones: those it always reads, or (optional)
    those read only when present."""
    shared = {f.name for f in fields(JobSettings)}
    return tuple(f.name for f in fields(schema) if f.name not in shared and ((f.default is not MISSING) == optional))


def typed_job_config(schema: Type[S], cfg: DictConfig) -> S:
    """The job's typed config from its prepared (cut, checked, read-only) node, made once at dispatch
    (OmegaConf.to_object per section): sections become their dataclasses, strata and effects plain
    mappings, components stay read-only nodes; the job's own dataclass is frozen."""
    hints = get_type_hints(schema)
    values: Dict[str, Any] = {}
    for f in fields(schema):
        if f.name not in cfg:
            require(f.default is not MISSING, f"job={cfg.job.name} needs the {f.name} section, which is missing")
            continue
        if hints[f.name] is Component or hints[f.name] == Optional[Component]:
            values[f.name] = cfg[f.name]
        else:
            values[f.name] = _resolved(cfg, f.name)
    return schema(**values)


def _resolved(cfg: DictConfig, name: str) -> Any:
    """A section as its dataclass (or mapping), a value as itself; an unresolvable value in one line."""
    from omegaconf.errors import InterpolationResolutionError

    try:
        return OmegaConf.to_object(cfg[name]) if OmegaConf.is_config(cfg._get_node(name)) else cfg[name]
    except InterpolationResolutionError as error:  # e.g. ${hydra:runtime.output_dir} outside a Hydra run
        from vlaeval.errors import first_line

        raise UserInputError(
            f"{error.full_key} cannot be resolved ({first_line(error.__cause__ or error)}: a config composed "
            f"outside a Hydra run has no run directory); set {error.full_key}=<value>"
        ) from None


def check_known_keys(cfg: Any, where: str = "") -> None:
    """Every key of a typed node is a field of its schema. Hydra's `+key=value` adds a key even to a
    typed node, so `+gauntlet.margin_detla=0.01` would otherwise run with the margin unchanged."""
    import difflib

    from omegaconf import DictConfig

    if not isinstance(cfg, DictConfig):
        return
    schema = OmegaConf.get_type(cfg)
    keys = [str(key) for key in cfg.keys()]
    if schema is not None and is_dataclass(schema):
        known = [f.name for f in fields(schema)]
        for key in keys:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                raise UserInputError(
                    f"{where}{key} is not a setting of {where.rstrip('.') or 'the config'}"
                    + (f"; did you mean {where}{close[0]}?" if close else f" (known: {', '.join(known)})")
                )
    for key in keys:
        if OmegaConf.is_missing(cfg, key) or OmegaConf.is_interpolation(cfg, key):
            continue
        check_known_keys(cfg._get_node(key), f"{where}{key}.")


# Every job is given these; each job's config dataclass names the rest it reads (vlaeval.jobs.dispatch).
SHARED_SECTIONS = tuple(f.name for f in fields(JobSettings))
# What building or loading a policy reads: the jobs that train, score or run one, and a gauntlet
# whose outcome source runs policies (outcomes=rollout).
POLICY_SECTIONS = job_sections(PolicyJobSettings)
