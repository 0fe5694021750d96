"""The question a gauntlet answers, and its words (pure).

A stratum's sequential test always runs two one-sided tests at one margin m: its PASS side rejects
H0: Delta <= m, its REGRESSION side rejects H0: Delta >= m (vlaeval.seqtest). Which margin, at
which levels, and what a rejection is called depend on the question the user asks:

* non_inferiority (a launch): m = -margin_delta; PASS certifies "not worse than the baseline by
  more than margin_delta" at alpha, REGRESSION "worse by more than margin_delta" at the alarm level
  (alpha split over the gauntlet's alarms); the recommendation is LAUNCH / DO_NOT_LAUNCH /
  NEEDS_REVIEW, with halts and blockers.
* superiority ("is the candidate better?"): m = +superiority_gain; BETTER certifies Delta > m,
  NOT_BETTER certifies Delta < m, each at alpha; the conclusion is BETTER (every stratum),
  NOT_BETTER (some stratum) or UNDECIDED.
* two_sided ("which is better?"): m = 0; BETTER certifies Delta > 0, WORSE Delta < 0, each
  direction at alpha; the conclusion is BETTER, WORSE, MIXED (strata disagree) or UNDECIDED.

A comparison is not a launch: no stratum halts the candidate, nothing is a "blocker", and the data's
provenance is noted, not held against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence

from vlaeval.choices import Question
from vlaeval.seqtest import DECISION_INSUFFICIENT, DECISION_PASS, DECISION_REGRESSION

BETTER = "BETTER"
NOT_BETTER = "NOT_BETTER"
WORSE = "WORSE"
UNDECIDED = "UNDECIDED"
MIXED = "MIXED"

# Conclusions of a comparison, beside LAUNCH / NEEDS_REVIEW / DO_NOT_LAUNCH; job=gauntlet's exit codes.
CONCLUSION_EXIT_CODES = {BETTER: 0, UNDECIDED: 10, MIXED: 10, NOT_BETTER: 11, WORSE: 11}


@dataclass(frozen=True)
class Asked:
    """The question as the tests see it: the margin m every stratum is tested at (a stratum may set
    its own margin_delta for a launch), and its words."""

    question: Question
    gain: float = 0.0  # superiority only: the declared gain Delta must exceed

    @property
    def launch(self) -> bool:
        return self.question.is_launch

    def margin(self, margin_delta: float) -> float:
        """The margin m of the stratum's tests (Delta compared with m)."""
        if self.question == Question.non_inferiority:
            return -margin_delta
        return self.gain if self.question == Question.superiority else 0.0

    def answer(self, decision: str) -> str:
        """The test's decision in the question's words."""
        if self.launch:
            return decision
        words: Dict[str, str] = {
            DECISION_PASS: BETTER,
            DECISION_REGRESSION: NOT_BETTER if self.question == Question.superiority else WORSE,
            DECISION_INSUFFICIENT: UNDECIDED,
        }
        return words.get(decision, decision)

    def certifies(self, decision: str, margin: float, level: float) -> str:
        """What a decision certifies, in one phrase: 'Delta > -0.020 at level 0.05 (one-sided)'."""
        if decision == DECISION_PASS:
            return f"Delta > {margin:+.3f} certified at level {level:.3g} (one-sided)"
        if decision == DECISION_REGRESSION:
            return f"Delta < {margin:+.3f} certified at level {level:.3g} (one-sided)"
        return "nothing certified yet"

    def title(self) -> str:
        """The question, as the report's heading says it."""
        if self.question == Question.superiority:
            gain = f" by more than {self.gain:g}" if self.gain else ""
            return f"Is the candidate better than the baseline{gain}? (superiority)"
        if self.question == Question.two_sided:
            return "Which policy is better? (two-sided comparison, each direction at alpha)"
        return "May the candidate replace the baseline? (launch: non-inferiority)"

    def conclusion(self, answers: Sequence[str]) -> str:
        """A comparison's overall answer from its strata's (intersection-union for BETTER)."""
        if not answers:
            return UNDECIDED
        if all(a == BETTER for a in answers):
            return BETTER
        if self.question == Question.superiority:
            return NOT_BETTER if NOT_BETTER in answers else UNDECIDED
        if all(a == WORSE for a in answers):
            return WORSE
        return MIXED if BETTER in answers and WORSE in answers else UNDECIDED


__all__ = [
    "Asked",
    "BETTER",
    "CONCLUSION_EXIT_CODES",
    "MIXED",
    "NOT_BETTER",
    "UNDECIDED",
    "WORSE",
]
