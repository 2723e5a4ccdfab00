"""A graph whose parts meet only at hubs, replayed part by part: what lets a job's ranks replay where their graphs
are, exchanging one time per hub.

A *hub* is a node outside every part whose time is the latest of its members' (nodes of any parts, weight 0 into the
hub); edges leave it into nodes of the parts with weights of their own. Every other edge stays within one part. A
:class:`Part` is one part's nodes and edges, the hubs its nodes are members of and the hub edges into it;
:class:`Replay` replays it for several scenarios at once as far as the hubs known so far allow (Kahn's algorithm,
resumed as hubs are released: :func:`advance`) and reports each member's arrival. Whoever holds the hubs
(:mod:`tracekit.scale.exchange`) releases a hub once all its members arrived, at the latest arrival. The times are
those of one ASAP sweep of the whole graph (:func:`tracekit.engine.asap`): a node with inputs at the max over them of
(source time + weight), a node without any at its given time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tracekit.engine import _kernels


@dataclass(frozen=True)
class Part:
    """One part: ``n`` nodes, its own edges (``src``, ``dst``: numbered ``0..m-1``), the hub edges into it
    (``tgt_hub``, ``tgt_dst``; numbered ``m..m+q-1`` after its own), its members (``mem_node`` arrives at
    ``mem_hub``) and, for the local hub numbers ``tgt_hub`` and ``mem_hub`` use, each one's number in the whole graph
    (``hubs``, ascending).
    ``start``: the time of a node without any input."""

    start: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    tgt_hub: np.ndarray
    tgt_dst: np.ndarray
    mem_node: np.ndarray
    mem_hub: np.ndarray
    hubs: np.ndarray

    @property
    def n(self) -> int:
        return self.start.size

    @property
    def edges(self) -> int:
        """Edges a scenario gives weights for: the part's own, then its hub edges."""
        return self.src.size + self.tgt_dst.size

    @cached_property
    def layout(self) -> _Layout:
        """The part's arrays as the kernel reads them (made once: every replay of the part reads the same)."""
        return _layout(self)


@dataclass(frozen=True)
class _Layout:
    """A part's arrays as the kernel reads them: edges by source, hub edges by hub, members by node."""

    out_ptr: np.ndarray
    out_dst: np.ndarray
    out_edge: np.ndarray
    tgt_ptr: np.ndarray
    tgt_dst: np.ndarray
    tgt_edge: np.ndarray
    mem_ptr: np.ndarray
    mem_hub: np.ndarray
    inputs: np.ndarray

    @cached_property
    def slot(self) -> np.ndarray:
        """Per edge of the part, its row in the kernel's order (its own edges by source, then its hub edges by hub):
        where :class:`Replay` with ``laid=True`` reads its weights."""
        out = np.empty(self.out_edge.size + self.tgt_edge.size, np.int32)
        out[self.out_edge] = np.arange(self.out_edge.size)
        out[self.tgt_edge] = self.out_edge.size + np.arange(self.tgt_edge.size)
        return out


def _by(key: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The order that groups ``key`` (values below ``size``; stable) and the group offsets (``size + 1``, int32)."""
    order = np.argsort(key, kind="stable")
    ptr = np.zeros(size + 1, np.int32)
    np.cumsum(np.bincount(key, minlength=size), out=ptr[1:])
    return order, ptr


def _layout(p: Part) -> _Layout:
    n, m = p.n, p.src.size
    o, out_ptr = _by(p.src, n)
    t, tgt_ptr = _by(p.tgt_hub, p.hubs.size)
    k, mem_ptr = _by(p.mem_node, n)
    inputs = (np.bincount(p.dst, minlength=n) + np.bincount(p.tgt_dst, minlength=n)).astype(np.int32)
    return _Layout(out_ptr, p.dst[o].astype(np.int32), o, tgt_ptr, p.tgt_dst[t].astype(np.int32), m + t, mem_ptr,
                   p.mem_hub[k].astype(np.int32), inputs)


class Replay:
    """One part replayed under ``weight`` (scenarios × :attr:`Part.edges`, int64): :meth:`advance` as hubs are
    released; :attr:`times` (nodes × scenarios) once every hub it needs was."""

    def __init__(self, part: Part, weight: np.ndarray, laid: bool = False) -> None:
        """``laid``: ``weight`` is already in the kernel's order (edges × scenarios, the rows of edge ``e`` at
        ``part.layout.slot[e]``: see :meth:`Part.layout`), and is kept, not copied."""
        lay = part.layout
        if laid:
            if weight.dtype != np.int64 or weight.ndim != 2 or weight.shape[0] != part.edges \
                    or not weight.flags.c_contiguous:
                raise ValueError(f"a part of {part.edges} edges given laid-out weights of shape {weight.shape}")
            m = lay.out_edge.size
            self.w_out, self.w_tgt, scenarios = weight[:m], weight[m:], weight.shape[1]
        else:
            weight = np.atleast_2d(np.asarray(weight, np.int64))
            if weight.shape[1] != part.edges:
                raise ValueError(f"a part of {part.edges} edges given weights for {weight.shape[1]}")
            self.w_out = np.ascontiguousarray(weight[:, lay.out_edge].T)
            self.w_tgt = np.ascontiguousarray(weight[:, lay.tgt_edge].T)
            scenarios = weight.shape[0]
        self.part, self.lay, self.scenarios = part, lay, scenarios
        self.left = lay.inputs.copy()
        self._settled = False
        self.acc = np.full((part.n, self.scenarios), np.iinfo(np.int64).min, np.int64)
        ready = np.flatnonzero(self.left == 0)
        self.acc[ready] = part.start[ready, None]
        self.stack = np.empty(part.n, np.int32)
        self.stack[:ready.size] = ready[::-1]
        self.top = np.array([ready.size], np.int64)
        self.arr_hub = np.empty(lay.mem_hub.size, np.int32)
        self.arr_time = np.empty((lay.mem_hub.size, self.scenarios), np.int64)

    def advance(self, hubs: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Release ``hubs`` (numbers in the whole graph; those this part has no edges from are passed over) at
        ``times`` (hubs × scenarios) and settle what that allows; returns the members that arrived meanwhile: their
        hubs (numbers in the whole graph) and times (× scenarios)."""
        own = self.part.hubs
        pos = np.minimum(np.searchsorted(own, hubs), max(own.size - 1, 0))
        mine = own[pos] == hubs if own.size else np.zeros(hubs.size, bool)
        local = pos[mine].astype(np.int32)
        got = _kernels.advance(self.lay.out_ptr, self.lay.out_dst, self.w_out, self.left, self.acc, self.stack,
                               self.top, self.lay.tgt_ptr, self.lay.tgt_dst, self.w_tgt, self.lay.mem_ptr,
                               self.lay.mem_hub, local, np.ascontiguousarray(times[mine], np.int64), self.arr_hub,
                               self.arr_time)
        if got < 0:
            raise RuntimeError("advance: more arrivals than the part has members")
        return self.part.hubs[self.arr_hub[:got]], self.arr_time[:got].copy()

    @property
    def settled(self) -> bool:
        """Whether every node has its time (remembered once true: a host reads each rank's times from one replay, and
        the check scans every node)."""
        if not self._settled:
            self._settled = bool(self.top[0] == 0 and not self.left.any())
        return self._settled

    @property
    def times(self) -> np.ndarray:
        """Node times (nodes × scenarios) of a settled replay."""
        if not self.settled:
            raise RuntimeError("the part's replay waits on hubs never released (a cycle through them?)")
        return self.acc



def merge(parts: list[Part]) -> tuple[Part, np.ndarray, list[np.ndarray]]:
    """One part of several (a host's ranks: one replay, one kernel call per release instead of one per rank): their
    nodes one after the other, their own edges, then their hub edges, hubs numbered as in the whole graph. Returns the
    part, each part's first node and, per part, where its edges (its own, then its hub edges) are among the merged
    part's."""
    n = np.cumsum([0] + [p.n for p in parts])
    m = np.cumsum([0] + [p.src.size for p in parts])
    q = np.cumsum([0] + [p.tgt_dst.size for p in parts])
    cat = np.concatenate
    hubs = np.unique(cat([p.hubs for p in parts])) if parts else np.zeros(0, np.int64)
    i32 = np.int32  # a host's nodes and edges number well below 2**31: half the bytes of its part
    merged = Part(start=cat([p.start for p in parts]),
                  src=cat([(p.src + n[i]).astype(i32) for i, p in enumerate(parts)]),
                  dst=cat([(p.dst + n[i]).astype(i32) for i, p in enumerate(parts)]),
                  tgt_hub=np.searchsorted(hubs, cat([p.hubs[p.tgt_hub] for p in parts])).astype(i32),
                  tgt_dst=cat([(p.tgt_dst + n[i]).astype(i32) for i, p in enumerate(parts)]),
                  mem_node=cat([(p.mem_node + n[i]).astype(i32) for i, p in enumerate(parts)]),
                  mem_hub=np.searchsorted(hubs, cat([p.hubs[p.mem_hub] for p in parts])).astype(i32), hubs=hubs)
    pos = [cat([m[i] + np.arange(p.src.size), m[-1] + q[i] + np.arange(p.tgt_dst.size)]).astype(i32)
           for i, p in enumerate(parts)]
    return merged, n[:-1], pos
