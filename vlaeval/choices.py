"""Every closed choice set of the configuration, as string Enums (no dependencies).

The structured-config schemas (vlaeval/config.py) type their fields with these, so a value outside
the set fails when Hydra composes the config, before any work; the library functions that take
the same choices validate against the same Enums. A member compares equal to its value
("exact" == TestMode.exact) and prints as it ("exact", not "TestMode.exact").
"""

from __future__ import annotations

from enum import Enum
from typing import Tuple, Type, TypeVar

C = TypeVar("C", bound="Choice")


class Choice(str, Enum):
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def values(cls) -> Tuple[str, ...]:
        return tuple(str(member.value) for member in cls)

    @classmethod
    def parse(cls: Type[C], value: object, what: str) -> C:
        """The member for `value`, or a ValueError naming the choices (for library callers)."""
        try:
            return cls(str(value))
        except ValueError:
            raise ValueError(f"{what}={value!r} is unknown; use one of {', '.join(cls.values())}") from None


class TestMode(Choice):
    __test__ = False  # not a pytest test class
    exact = "exact"  # betting e-processes: valid at every sample size (the default)
    asymptotic = "asymptotic"  # opt-in, labelled: asymptotic confidence sequences
    group_sequential = "group_sequential"  # opt-in, labelled: O'Brien-Fleming spending over planned batches
    horizon = "horizon"  # opt-in, exact within a declared horizon: alpha spent over the stratum's planned clusters

    @property
    def certifies(self) -> bool:
        """Whether the mode's decisions are certificates (exact at their level), not approximate evidence."""
        return self in (TestMode.exact, TestMode.horizon)


class Question(Choice):
    """What a gauntlet asks of each stratum (docs/gauntlet.md "The question is yours")."""

    non_inferiority = "non_inferiority"  # a launch: not worse than the baseline by more than margin_delta
    superiority = "superiority"  # "is the candidate better?": Delta > superiority_gain certified (or not)
    two_sided = "two_sided"  # "which is better?": better, worse or undecided, each direction at alpha

    @property
    def is_launch(self) -> bool:
        return self is Question.non_inferiority


class BetRule(Choice):
    agrapa = "agrapa"
    prpl = "prpl"
    blend = "blend"
    ons = "ons"
    mixture = "mixture"  # the average of constant bets under a Beta(3, 2) prior (vlaeval/seqtest/eprocess.py)


# The mixture of constant bets: 0.93 of the blend rule's expected trials on paired single-trial comparisons
# within 200 trials (benchmarks/peer_comparison.py), as fast or faster on clustered strata
# (benchmarks/seqtest_efficiency.py); blend was the default before it.
DEFAULT_BET_RULE = BetRule.mixture
# Fixed orders averaged by the order-free test on a file (benchmarks/certified_decisions.py, section 7).
DEFAULT_ORDERS = 16


class Estimand(Choice):
    cluster = "cluster"  # the mean of cluster means
    unit = "unit"  # the scenario-weighted mean


class AlarmFwer(Choice):
    bonferroni = "bonferroni"  # each alarm at alpha / (K + H)
    none = "none"  # each alarm at alpha


class Preflight(Choice):
    warn = "warn"
    error = "error"
    off = "off"


class ClusterOrder(Choice):
    # The e-processes control the conditional mean given the past: clusters must come in random
    # order for the result to be about the stratum's mean (docs/gauntlet.md "What the guarantee is about").
    shuffled = "shuffled"  # a seeded random permutation of the source's clusters (the default)
    as_given = "as_given"  # the source's order, declared random by the user (recorded in lineage)


class Executor(Choice):
    # Where rollouts run (outcomes=rollout): the outcomes do not depend on it.
    local = "local"  # a process pool on this machine (rollout.workers processes)
    ray = "ray"  # Ray tasks: a local instance, or the cluster at rollout.ray_address


class StrataFrom(Choice):
    file = "file"  # an outcome file's strata are evaluated; configured ones it lacks are reported
    config = "config"  # a stratum the config lacks is refused


class StratumKind(Choice):
    safety = "safety"  # safety strata: an undecided one is flagged as such in the review reasons
    general = "general"


class EstimatorKind(Choice):
    iid = "iid"
    midpoint_antithetic = "midpoint_antithetic"
    stratified = "stratified"
    sobol = "sobol"


class NoiseEnd(Choice):
    # Which end of the policy's flow time t is pure noise.
    one = "one"  # openpi / LeRobot pi0 / SmolVLA: x_t = t * eps + (1 - t) * a
    zero = "zero"  # GR00T-style: x_t = t * a + (1 - t) * eps


class VelocityTarget(Choice):
    # What the policy's velocity is trained to predict.
    noise_minus_action = "noise_minus_action"  # eps - a (pi0)
    action_minus_noise = "action_minus_noise"  # a - eps (GR00T-style)


class TimeDistribution(Choice):
    # The training distribution of t, before time_scale and time_offset: t = x * scale + offset.
    beta = "beta"  # x ~ Beta(beta_a, beta_b) (pi0: Beta(1.5, 1))
    uniform = "uniform"  # x ~ U(0, 1) (rectified flow)
    logit_normal = "logit_normal"  # x = sigmoid(N(logit_mean, logit_std)) (SD3-style)


class TimeSampling(Choice):
    # How job=train draws flow time (vlaeval/policy/time_sampling.py).
    uniform = "uniform"  # from the training distribution itself (the policy's own objective, unweighted)
    adaptive = "adaptive"  # over equal-probability bins, refreshed online from each bin's loss, importance-weighted


class AnchorSampling(Choice):
    # How job=train draws anchors.
    uniform = "uniform"  # every anchor equally often (the training distribution)
    residual = "residual"  # the audit's proposal from each anchor's residual, importance-weighted 1 / (N q)


class TimeSignal(Choice):
    # What the adaptive flow-time sampler tracks per bin; bin k is drawn with p_k ~ sqrt(EMA of it).
    loss = "loss"  # the per-sample loss: for a squared error, ||d loss / d velocity||^2 = 4 loss / entries
    squared_loss = "squared_loss"  # its square (Improved DDPM's importance sampling of the timestep)


class GradientMethod(Choice):
    auto = "auto"  # per-layer exact norms from one backward (Linear by its Gram form), torch.func for other layers
    functional = "functional"  # torch.func per-sample gradients of the whole trainable set, in chunks
    loop = "loop"  # one backward pass per sample: the reference


class AblationProposal(Choice):
    uniform = "uniform"  # the training distribution: every anchor and flow time as in training
    residual = (
        "residual"  # the audit's proposal from the residual score (audit.alpha, percentile_epsilon, proposal_power)
    )
    training_loss = "training_loss"  # the same transform of the training loss on draws independent of the judge's
    gradient_oracle = (
        "gradient_oracle"  # the same transform of gradient RMS^2 from build draws disjoint from the judge's
    )
    flow_time = "flow_time"  # uniform anchors, flow time from a proposal over equal-probability bins
    residual_flow_time = "residual_flow_time"  # the residual proposal over anchors x the flow-time proposal
    # Flow time from train.time_sampling=adaptive's online sampler (train.time_* settings; no gradient
    # passes), anchors uniform or from the residual proposal.
    adaptive_flow_time = "adaptive_flow_time"
    residual_adaptive_flow_time = "residual_adaptive_flow_time"


class Optimizer(Choice):
    adamw = "adamw"  # what the built-in policy is trained with
    sgd = "sgd"  # plain SGD: the step's noise is the minibatch gradient's variance, unnormalised


class Verdict(Choice):
    """The gate's three-way verdict on the predicted second-moment ratio (vlaeval/audit/verdict.py)."""

    PASS = "PASS"  # the interval's upper end below the threshold
    FAIL = "FAIL"  # its lower end above
    UNDECIDED = "UNDECIDED"  # the threshold inside it: more anchors would decide


class ObservationConvention(Choice):
    """How a LeRobot policy is shown observations (vlaeval/policy/lerobot_adapter.py)."""

    vlaeval = "vlaeval"  # the state and cameras as vlaeval records them
    metaworld = "metaworld"  # as LeRobot's MetaworldEnv presents them (its Meta-World datasets and policies)


class TrainableSubset(Choice):
    action_head = "action_head"
    all = "all"


class CheckpointKind(Choice):
    builtin = "builtin"  # train on first use, cached by config hash
    path = "path"  # a given weights-only checkpoint


class DataLabel(Choice):
    REPLAYED = "REPLAYED"
    SIMULATED = "SIMULATED"
    COUNTERFACTUAL = "COUNTERFACTUAL"
    GENERATED = "GENERATED"  # made up by the synthetic generator: a demonstration, no evidence about a policy
    UNDECLARED = "UNDECLARED"  # an outcome file that says nothing of where its outcomes came from


class HaltRule(Choice):
    # When a halting stratum (strata.<name>.catastrophic_halt) stops the whole candidate.
    # regression_beyond_margin: its REGRESSION is certified at the alarm level and, at the end of the
    #   deciding batch, the halt's own one-sided upper confidence sequence lies beyond
    #   -catastrophic_delta; the stratum stops at its decision (the prototype read the estimate there,
    #   which the stopping biases).
    # certified_catastrophic: only once the halt's own one-sided upper confidence sequence lies at
    #   or below -catastrophic_delta (the stratum runs on after its REGRESSION to find out).
    regression_beyond_margin = "regression_beyond_margin"
    certified_catastrophic = "certified_catastrophic"


class InstructionMode(Choice):
    # What a rollout scenario family tells each episode's policy (vlaeval/rollouts/language.py).
    task = "task"  # the task's own instruction
    paraphrase = "paraphrase"  # a rephrasing in mostly the same words
    unseen = "unseen"  # a phrasing in words the demonstrations never used
    other_task = "other_task"  # another task's instruction: the negative control


class OfflineMetric(Choice):
    """An offline number job=offline_validity checks against closed-loop success (vlaeval/residual/offline.py)."""

    heldout_loss = "heldout_loss"  # the flow-matching loss on held-out scenes
    heldout_loss_by_time = "heldout_loss_by_time"  # the same, per bin of the noise level
    action_error = "action_error"  # the sampled chunk against the expert's actions
    residual_mean = "residual_mean"  # the audit's frozen residual, averaged over training anchors
    audit_ratio = "audit_ratio"  # the audit's predicted second-moment ratio
