"""Setting the clock of a Horovod <= 0.20.0 timeline (no absolute origin) against rank 0's trace: the offset
that puts rank 0's communication kernels inside the timeline's transfer phases (:func:`align`, FORMATS.md
§5.4; :mod:`tracekit.analysis.horovod.windows` says when it is used and what is refused).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: a kernel may start or end this much outside the transfer phase Horovod logged around it
ALIGN_SLACK_NS = 20_000
#: share of rank 0's communication kernels that must fall inside a Horovod transfer phase
ALIGN_MIN_SHARE = 0.6
#: kernels sampled to score candidate offsets, and candidates scored per batch
_ALIGN_SAMPLE = 256
_ALIGN_BATCH = 2048


@dataclass
class Alignment:
    """Result of :func:`align`: the offset (None when refused) and a one-line account."""

    offset_ns: int | None
    text: str
    matched: int = 0
    uncertainty_ns: int | None = None


def align(rs: np.ndarray, re: np.ndarray, ks: np.ndarray, ke: np.ndarray, *,
          r_it: np.ndarray | None = None, k_it: np.ndarray | None = None) -> Alignment:
    """The offset d (ns) that puts the kernels ``[ks, ke)`` inside the Horovod transfer phases ``[rs, re)``
    shifted by d (``rs + d <= ks`` and ``ke <= re + d``, within :data:`ALIGN_SLACK_NS`).

    Candidates come from pairing up to three anchor kernels with every response long enough to hold them
    (the middle of the interval of offsets that fits the pair); each is scored by how many of up to
    :data:`_ALIGN_SAMPLE` kernels it puts inside a response (vectorised: one searchsorted per batch of
    candidates). Best-scoring candidates further apart than a response are *different* alignments: a
    periodic job fits shifts by whole iterations equally. Then the iteration numbers decide, when given
    (``r_it`` per response, ``k_it`` per kernel): the alignment where kernels of step k sit in Horovod's
    iteration k wins; otherwise the result is refused. The chosen offset is refined to the middle of the
    interval every matched pair allows, whose half-width is the uncertainty.
    """
    rs, re = np.asarray(rs, np.int64), np.asarray(re, np.int64)
    ks, ke = np.asarray(ks, np.int64), np.asarray(ke, np.int64)
    if rs.size == 0:
        return Alignment(None, "the timeline has no transfer phase to align")
    if ks.size < 3:
        return Alignment(None, "rank 0's trace has no communication kernels to align the timeline on")
    o = np.argsort(rs, kind="stable")
    rs, re = rs[o], re[o]
    r_it = None if r_it is None else np.asarray(r_it)[o]
    ko = np.argsort(ks, kind="stable")
    ks, ke = ks[ko], ke[ko]
    k_it = None if k_it is None else np.asarray(k_it)[ko]
    sample = np.unique(np.linspace(0, ks.size - 1, min(ks.size, _ALIGN_SAMPLE)).round().astype(np.int64))
    sks, ske = ks[sample], ke[sample]
    rlen = re - rs
    cands = []
    for a in np.unique(np.array([0, ks.size // 2, ks.size - 1])):
        klen = ke[a] - ks[a]
        ok = rlen >= klen - 2 * ALIGN_SLACK_NS
        cands.append(((ks[a] - rs[ok]) + (ke[a] - re[ok])) // 2)
    cand = np.unique(np.concatenate(cands))
    if cand.size == 0:
        return Alignment(None, "no Horovod transfer phase is long enough to hold rank 0's communication kernels")
    scores = np.empty(cand.size, dtype=np.int64)
    for lo in range(0, cand.size, _ALIGN_BATCH):
        d = cand[lo:lo + _ALIGN_BATCH, None]
        scores[lo:lo + _ALIGN_BATCH] = _contained(rs, re, sks[None, :] - d, ske[None, :] - d).sum(axis=1)
    best = int(scores.max())
    need = max(3, int(np.ceil(ALIGN_MIN_SHARE * sample.size)))
    if best < need:
        return Alignment(None, f"at best {best} of {sample.size} communication kernels of rank 0's trace fall "
                               "inside a Horovod transfer phase, whatever the offset")
    tie = max(1, sample.size // 50)
    good = np.sort(cand[scores >= best - tie])
    gap = int(np.median(rlen)) + 2 * ALIGN_SLACK_NS
    cluster_starts = np.r_[0, np.flatnonzero(np.diff(good) > gap) + 1]
    reps = [int(np.median(c)) for c in np.split(good, cluster_starts[1:])]
    note = ""
    if len(reps) > 1:
        if r_it is None or k_it is None:
            return Alignment(None, f"{len(reps)} offsets (shifts by whole iterations) fit rank 0's kernels "
                                   "equally well")
        agree = []
        for d in reps:
            j = _container(rs, re, ks - d, ke - d)
            m = (j >= 0) & (k_it >= 0)
            agree.append(float(np.mean(k_it[m] == r_it[j[m]])) if m.any() else 0.0)
        winners = [d for d, a in zip(reps, agree, strict=True) if a >= 0.8]
        if len(winners) != 1:
            return Alignment(None, f"{len(reps)} offsets (shifts by whole iterations) fit rank 0's kernels equally "
                                   "well, and the step numbers do not single one out")
        reps = winners
        note = "; of the shifts by whole iterations, the one where ProfilerStep#k holds Horovod's iteration k"
    d0 = reps[0]
    j = _container(rs, re, ks - d0, ke - d0)
    m = j >= 0
    lower = int((ke[m] - re[j[m]]).max())
    upper = int((ks[m] - rs[j[m]]).min())
    if lower <= upper:
        d, unc = (lower + upper) // 2, (upper - lower) // 2
    else:
        d = int(np.median(((ks[m] - rs[j[m]]) + (ke[m] - re[j[m]])) // 2))
        unc = (lower - upper) // 2
    return Alignment(d, f"aligned on {int(m.sum())} of {ks.size} communication kernels of rank 0's trace "
                        f"(±{unc / 1000:.0f} µs){note}", matched=int(m.sum()), uncertainty_ns=unc)


def _contained(rs: np.ndarray, re: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Whether each interval [s, e) lies inside the response that starts last at or before s (+ slack)."""
    i = np.searchsorted(rs, s + ALIGN_SLACK_NS, side="right") - 1
    return (i >= 0) & (e <= re[np.maximum(i, 0)] + ALIGN_SLACK_NS)


def _container(rs: np.ndarray, re: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    i = np.searchsorted(rs, s + ALIGN_SLACK_NS, side="right") - 1
    ok = (i >= 0) & (e <= re[np.maximum(i, 0)] + ALIGN_SLACK_NS)
    return np.where(ok, i, -1)
