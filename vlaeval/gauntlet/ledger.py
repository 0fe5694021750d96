"""The evidence ledger: what each stratum's test of an outcome file has already seen, so that a later
run whose evidence repeats or extends it continues that test instead of restarting it.

A file that grows is a stream of versions. Re-running the gauntlet after every 50 new scenes and
keeping the first PASS restarts the test each time (0.097 false PASS over 100 -> 600 scenes, against
0.020 for one run). So each stratum's tested evidence is recorded: its clusters as canonical keys (the
multiset of a cluster's paired outcomes -- both succeed, baseline only, candidate only, both fail --
which no id, row order, format or extra column changes), in the blocks (looks) they were tested in.
A later run on the same stratum under the same test settings looks for the largest recorded evidence
contained in its own: it replays those blocks in their order and tests only the new clusters as one
more block, which each order of the order-free test appends after the old ones
(vlaeval.seqtest.order_free: optional continuation, valid by Ville's inequality over the looks).

What cannot be continued is said, not hidden: clusters of an earlier test missing from this file (a
re-export that dropped or changed scenes), or the same evidence tested under other settings (another
margin, level or estimand) -- the recommendation then needs review. A re-test is the same comparison:
the entries are kept per stratum *and* per pair of versions compared (the file's or the config's), so
another candidate's file for the same stratum is neither continued nor flagged -- its outcome patterns
may coincide, its evidence is its own. Unnamed comparisons (the roles "baseline" and "candidate") share
one record per stratum, as a file without version columns cannot be told from another. A file whose
clusters are an earlier test's under another stratum name or other versions (a sub-multiset of them,
or holding all of them, beyond what fresh scenes do) is that evidence renamed: it cannot continue and
is reviewed. Where nothing could be consulted -- the ledger off, or no earlier test of this
comparison's stratum recorded -- the continuation says so, and the console and result.json with it; where job=gauntlet also read no
tracking store (tracking off, or unreadable), nothing could remember a test run in another workspace,
and a PASS is reviewed (UNTRACKED), as with the ledger off.

Where evidence lives. A CI workspace starts with a fresh `paths.cache_dir`; the tracking store is
what its runs share. So a tracked gauntlet run tags itself `vlaeval.ledger.<key>` for each stratum
whose evidence it recorded (its result.json holds that evidence), and before testing, job=gauntlet
reads every run so tagged for this comparison's strata from the store into the local ledger
(vlaeval/jobs/gauntlet.py: shared_evidence): a fresh workspace continues, or cannot continue, what
any workspace tracked to the same store tested. A continuation whose new look only repeats the earlier looks' outcome patterns --
the file's own scenes re-appended under new ids -- is flagged as copies (copied_look) and reviewed.

Entries live in `<cache_dir>/gauntlet-ledger/<comparison and stratum digest>/<entry digest>.json`, each
written atomically once (the ledger is append-only; nothing is rewritten).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from vlaeval.artifacts import atomic_write_json, sha256_json, stable_seed
from vlaeval.seqtest.units import cluster_offsets, fit_dirichlet_multinomial

NEW, CONTINUES, REPEATS, CANNOT_CONTINUE = "new", "continues", "repeats", "cannot_continue"
COPIES = "copies"  # continues, but the new look repeats the earlier looks' clusters (the recommendation reviews it)
# A new look is taken for copies of the earlier ones when its clusters' outcome patterns are a
# sub-multiset of the earlier looks' and simulated fresh looks are so with chance below this level.
COPIED_LOOK_LEVEL, COPIED_LOOK_DRAWS = 0.01, 999
# What the ledger could say of a stratum's earlier tests: it was read (and held this comparison's
# stratum), it held nothing of it, or it was switched off (gauntlet.evidence_ledger=false).
# not_given: a library caller that passed no ledger (nothing is said; run_gauntlet's docstring).
CONSULTED, NOTHING_RECORDED, LEDGER_OFF, NOT_GIVEN = "consulted", "nothing_recorded", "off", "not_given"
# Nothing recorded in the local ledger and no tracking store read (job=gauntlet with tracking off, or a
# store it could not read): the evidence of a test run in another workspace is lost, so a PASS is reviewed.
UNTRACKED = "nothing_recorded_untracked"
UNNAMED = ("baseline", "candidate")  # the roles, where no version names the policies


@dataclass(frozen=True)
class Comparison:
    """Whose evidence a ledger entry holds: the versions compared (the roles where none are named)."""

    baseline: str
    candidate: str

    @property
    def named(self) -> bool:
        return (self.baseline, self.candidate) != UNNAMED


def cluster_keys(baseline: np.ndarray, candidate: np.ndarray, sizes: np.ndarray) -> List[str]:
    """Each cluster's canonical key: its units as a multiset of paired outcomes, written
    "<both succeed>/<baseline only>/<candidate only>/<both fail>" (units in any order, any ids)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.size == 0:
        return []
    starts = cluster_offsets(sizes)[:-1]
    b, c = np.asarray(baseline, dtype=bool), np.asarray(candidate, dtype=bool)
    counts = [np.add.reduceat((mask).astype(np.int64), starts) for mask in (b & c, b & ~c, ~b & c, ~b & ~c)]
    return [f"{w}/{x}/{y}/{z}" for w, x, y, z in zip(*(a.tolist() for a in counts))]


def blocks_from_json(blocks: Sequence[Mapping[str, Any]]) -> Tuple[Counter[str], ...]:
    """Blocks as written (key -> count objects) back to multisets."""
    return tuple(Counter({str(k): int(v) for k, v in b.items()}) for b in blocks)


def blocks_to_json(blocks: Sequence[Mapping[str, int]]) -> List[Dict[str, int]]:
    """Blocks as JSON objects, keys sorted (the same evidence always writes the same bytes)."""
    return [dict(sorted(b.items())) for b in blocks]


def _contains(outer: Mapping[str, int], inner: Mapping[str, int]) -> bool:
    return all(outer.get(k, 0) >= v for k, v in inner.items())


def _shared(a: Mapping[str, int], b: Mapping[str, int]) -> int:
    return sum(min(v, b.get(k, 0)) for k, v in a.items())


@dataclass(frozen=True)
class Continuation:
    """What a stratum's test continues: the earlier blocks to replay first (each a key -> count
    multiset, in their order), the run that tested them and its looks; or why it cannot."""

    status: str = NEW  # new, continues, repeats, cannot_continue
    blocks: Tuple[Mapping[str, int], ...] = ()
    run: Optional[str] = None
    note: str = ""
    ledger: str = CONSULTED  # consulted, nothing_recorded, off, not_given

    @classmethod
    def cannot(cls, why: str) -> "Continuation":
        """A test that must restart, and why (the recommendation then needs review)."""
        return cls(CANNOT_CONTINUE, note=f"{why}; this test restarts, so re-testing is not covered by its guarantee")

    @classmethod
    def unconsulted(cls) -> "Continuation":
        """The ledger is off: no earlier test was looked for (a PASS then needs review)."""
        return cls(
            note="the evidence ledger is off (gauntlet.evidence_ledger=false): no earlier test of this evidence was "
            "consulted, so a re-test after an earlier decision is not covered by the guarantee",
            ledger=LEDGER_OFF,
        )

    @classmethod
    def first(cls, where: Path, shared: Optional[str], untracked: bool) -> "Continuation":
        """Nothing recorded of this comparison's stratum: the first test of it that this ledger holds
        (`shared`: the tracking store its entries were also read from; `untracked`: job=gauntlet read
        none -- tracking is off or the store could not be read)."""
        if shared:
            elsewhere = f" nor in the tracking store {shared} (runs tracked there by any workspace were read)"
        elif untracked:
            elsewhere = (
                " and no tracking store was read, so a test run elsewhere (another paths.cache_dir, a fresh CI "
                "workspace) is not known here -- track runs to a shared store (tracking.uri) so that none is forgotten"
            )
        else:
            elsewhere = ""
        return cls(
            note=f"no earlier test of this comparison's stratum is recorded in the evidence ledger {where}{elsewhere}",
            ledger=UNTRACKED if untracked and not shared else NOTHING_RECORDED,
        )

    @property
    def looks(self) -> int:
        return len(self.blocks)

    @property
    def continued_clusters(self) -> int:
        return sum(sum(b.values()) for b in self.blocks)

    def as_dict(self) -> Dict[str, Any]:
        return {
            "status": self.status,
            "run": self.run,
            "earlier_looks": self.looks,
            "note": self.note,
            "ledger": self.ledger,
        }


@dataclass(frozen=True)
class Evidence:
    """One stratum's tested evidence as the ledger records it: the test's settings fingerprint, the
    blocks (looks) in order, and what it continued."""

    fingerprint: str
    blocks: Tuple[Mapping[str, int], ...]
    continuation: Continuation = field(default_factory=Continuation)

    def to_json(self) -> Dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "blocks": blocks_to_json(self.blocks),
            "continuation": self.continuation.as_dict(),
        }


class EvidenceLedger:
    """The append-only record of tested evidence under `folder` (see the module docstring)."""

    def __init__(self, folder: str | Path, shared: Optional[str] = None, untracked: bool = False) -> None:
        self.folder = Path(folder)
        self.shared = shared  # the tracking store this ledger's entries were also read from (None: not read)
        self.untracked = untracked  # job=gauntlet read no tracking store (off, or unreadable)

    @staticmethod
    def key(stratum: str, comparison: Comparison) -> str:
        """The digest naming one comparison's stratum: its folder here, its tag in the tracking store."""
        key: Dict[str, str] = {"stratum": stratum}
        if comparison.named:  # unnamed comparisons keep one record per stratum
            key.update(baseline=comparison.baseline, candidate=comparison.candidate)
        return sha256_json(key)[:16]

    def _stratum_folder(self, stratum: str, comparison: Comparison) -> Path:
        return self.folder / self.key(stratum, comparison)

    def _entries(self, stratum: str, comparison: Comparison) -> List[Dict[str, Any]]:
        folder = self._stratum_folder(stratum, comparison)
        return _read_entries(sorted(folder.glob("*.json"))) if folder.is_dir() else []

    def _relabelled(self, stratum: str, comparison: Comparison, keys: Sequence[str]) -> Optional[str]:
        """Why this stratum's clusters are another comparison's (or stratum's) tested evidence under a
        new name (None: they are not): the clusters are a sub-multiset of an earlier test's, or hold all
        of its clusters, which fresh scenes would be with chance below COPIED_LOOK_LEVEL. A renamed
        stratum or version makes no new evidence; an independent file of another comparison is not
        contained in it (its outcome patterns differ) and is neither continued nor flagged."""
        here = Counter(keys)
        own = self._stratum_folder(stratum, comparison)
        for entry in _read_entries(sorted(p for p in self.folder.glob("*/*.json") if p.parent != own)):
            whole = _evidence(entry)
            if _contains(whole, here):
                p_value = copies_p_value(whole, list(keys))
            elif _contains(here, whole):
                p_value = copies_p_value(here, list(whole.elements()))
            else:
                continue
            if p_value is not None and p_value < COPIED_LOOK_LEVEL:
                return (
                    f"run {entry.get('run')} tested {_shared(whole, here)} of these clusters as stratum "
                    f"{entry.get('stratum')!r} ({entry.get('candidate')} vs {entry.get('baseline')}), which fresh "
                    f"scenes would repeat with chance p = {p_value:.3f}: a renamed stratum or version is the same "
                    "evidence, and its earlier test counts"
                )
        return None

    def find(self, stratum: str, comparison: Comparison, fingerprint: str, keys: Sequence[str]) -> Continuation:
        """The earlier evidence of this comparison that this stratum's clusters (`keys`) repeat or
        extend under the same test settings (the largest such), or a note on evidence that cannot be
        continued, or that nothing of it is recorded."""
        here = Counter(keys)
        best: Optional[Dict[str, Any]] = None
        conflicts: List[Tuple[int, bool, str]] = []  # (size, same settings, words)
        entries = self._entries(stratum, comparison)
        if not entries:
            relabelled = self._relabelled(stratum, comparison, keys)
            if relabelled:
                return Continuation.cannot(relabelled)
            return Continuation.first(self.folder, self.shared, self.untracked)
        for entry in entries:
            whole = _evidence(entry)
            size = sum(whole.values())
            same = entry.get("fingerprint") == fingerprint
            if same and _contains(here, whole):
                if best is None or size > best["_size"]:
                    best = {**entry, "_size": size}
            elif size and (_shared(whole, here) * 2 >= size or _contains(whole, here)):
                why = (
                    f": {size - _shared(whole, here)} of its {size} clusters are missing here"
                    if same
                    else " under other test settings (margin, level, estimand, bets or orders)"
                )
                conflicts.append((size, same, f"run {entry.get('run')} tested this stratum's clusters{why}"))
        # A later test of more of this evidence that this file drops clusters of: continuing the
        # earlier one from here would fork the evidence (two different next looks), so it cannot.
        forks = [words for size, same, words in conflicts if same and best is not None and size > best["_size"]]
        if forks:
            return Continuation.cannot(forks[0])
        if best is not None:
            repeat = best["_size"] == len(keys)
            return Continuation(
                REPEATS if repeat else CONTINUES,
                tuple(best["blocks"]),
                best.get("run"),
                (
                    f"repeats run {best.get('run')} ({len(best['blocks'])} look(s)): the same evidence, the same decision"
                    if repeat
                    else f"continues run {best.get('run')}: its {best['_size']} clusters in its "
                    f"{len(best['blocks'])} look(s), then {len(keys) - best['_size']} new ones as one more look"
                ),
            )
        if conflicts:
            return Continuation.cannot(conflicts[0][2])
        return Continuation()

    def record(self, stratum: str, comparison: Comparison, evidence: Evidence, run: str, decision: str) -> Path:
        """Add one stratum's tested evidence (after the run's result is saved)."""
        entry = {
            "stratum": stratum,
            "baseline": comparison.baseline,
            "candidate": comparison.candidate,
            "run": run,
            "fingerprint": evidence.fingerprint,
            "blocks": blocks_to_json(evidence.blocks),
            "decision": decision,
        }
        path = self._stratum_folder(stratum, comparison) / f"{sha256_json(entry)[:24]}.json"
        return path if path.exists() else atomic_write_json(path, entry)

    def record_result(self, strata: Sequence[Any], comparison: Comparison, run: str) -> List[Path]:
        """Every stratum of a gauntlet result (`StratumResult`s) whose test recorded its evidence."""
        written = []
        for s in strata:
            data = s.details.get("evidence")
            if data:
                evidence = Evidence(data["fingerprint"], blocks_from_json(data["blocks"]))
                written.append(self.record(s.stratum, comparison, evidence, run, s.decision))
        return written


def _evidence(entry: Mapping[str, Any]) -> Counter[str]:
    """All of an entry's clusters (its blocks' union) as one multiset of keys."""
    whole: Counter[str] = Counter()
    for block in entry["blocks"]:
        whole.update(block)
    return whole


def _read_entries(paths: Sequence[Path]) -> List[Dict[str, Any]]:
    out = []
    for path in paths:
        try:
            entry = json.loads(path.read_text())
            entry["blocks"] = blocks_from_json(entry["blocks"])
            out.append(entry)
        except (OSError, ValueError, KeyError, AttributeError):
            continue  # a damaged entry is no evidence: the test restarts rather than trust it
    return out


def copied_look(earlier: Sequence[Mapping[str, int]], new_keys: Sequence[str]) -> Optional[str]:
    """Why a new look's clusters read as copies of the earlier looks' (None: they do not). Copies
    re-appended under new ids count the same scenes twice, which no continuation covers."""
    before: Counter[str] = Counter()
    for block in earlier:
        before.update(block)
    p_value = copies_p_value(before, new_keys)
    if p_value is None or p_value >= COPIED_LOOK_LEVEL:
        return None
    return (
        f"its {len(new_keys)} new clusters all repeat outcome patterns of the earlier looks, which fresh scenes "
        f"do with chance p = {p_value:.3f}: if scenes were re-appended under new ids they count twice, which the "
        "guarantee does not cover; check the export"
    )


def copies_p_value(before: Mapping[str, int], new_keys: Sequence[str]) -> Optional[float]:
    """How often fresh scenes would be a sub-multiset of `before`'s outcome patterns as `new_keys` is
    (None: it is not one). Simulated: COPIED_LOOK_DRAWS looks of as many scenes of the same sizes,
    each drawn from a Dirichlet-multinomial over the four kinds of pair fitted to `before`'s clusters,
    seeded from the keys; the p-value counts the draw itself."""
    before = Counter(before)
    if not new_keys or not _contains(before, Counter(new_keys)):
        return None
    held = np.asarray([[int(v) for v in k.split("/")] for k in before.elements()], dtype=np.int64)
    alpha = fit_dirichlet_multinomial(held.astype(np.float64))
    used = alpha > 0
    sizes = Counter(sum(int(v) for v in k.split("/")) for k in new_keys)
    rng = np.random.default_rng(stable_seed("copied-look", sha256_json(sorted(new_keys))))
    contained = np.ones(COPIED_LOOK_DRAWS, dtype=np.bool_)
    for size, count in sorted(sizes.items()):
        shares = np.zeros((COPIED_LOOK_DRAWS, count, alpha.size))
        shares[..., used] = rng.dirichlet(alpha[used], (COPIED_LOOK_DRAWS, count))
        drawn = rng.multinomial(size, shares / shares.sum(axis=-1, keepdims=True))
        for d in np.flatnonzero(contained):
            keys = Counter("/".join(map(str, row)) for row in drawn[d].tolist())
            contained[d] = _contains(before, keys)
    return (1 + int(contained.sum())) / (1 + COPIED_LOOK_DRAWS)


def split_blocks(keys: Sequence[str], continuation: Continuation) -> Tuple[List[np.ndarray], np.ndarray]:
    """The cluster indices of each earlier block (in the ledger's order) and of the new clusters.
    Clusters with one key are interchangeable (the same outcomes), so any of them serves."""
    pools: Dict[str, List[int]] = {}
    for index, key in enumerate(keys):
        pools.setdefault(key, []).append(index)
    blocks = []
    for block in continuation.blocks:
        taken = []
        for key, count in sorted(block.items()):
            taken.extend(pools[key][:count])
            pools[key] = pools[key][count:]
        blocks.append(np.asarray(sorted(taken), dtype=np.int64))
    rest = np.asarray(sorted(i for left in pools.values() for i in left), dtype=np.int64)
    return blocks, rest
