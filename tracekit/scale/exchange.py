"""The replay of a job whose ranks' graphs are held apart (:mod:`tracekit.engine.parts`), collective by collective:
the ranks' parts settle what they can, report their members' arrivals at the hubs (an instance's latest start), and
the exchange releases each hub once all its members arrived, at the latest arrival — one time per hub and scenario is
all that crosses ranks, so what the exchange holds grows with the collectives, not with the job's events.

A *host* holds some parts' replays where their graphs are (this process, a worker process, a Dask worker) and answers
:meth:`Host.advance`; :func:`settle` drives any number of them round by round (a round releases every hub whose last
member arrived in the round before: as many rounds as the longest chain of collectives that wait on each other).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from tracekit.engine.parts import Part, Replay

NONE = np.iinfo(np.int64).min


class Host(Protocol):
    """Some parts' replays: :meth:`advance` releases hubs (ids, times: hubs × scenarios) and returns the arrivals the
    parts' nodes settled meanwhile (hubs, times)."""

    def advance(self, hubs: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


class Parts:
    """A host in this process: ``parts`` replayed under ``weights`` (per part: scenarios × its edges)."""

    def __init__(self, parts: Sequence[Part], weights: Sequence[np.ndarray]) -> None:
        self.replays = [Replay(p, w) for p, w in zip(parts, weights, strict=True)]

    def advance(self, hubs: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        got = [r.advance(hubs, times) for r in self.replays]
        s = self.replays[0].scenarios if self.replays else 1
        return (np.concatenate([g[0] for g in got]) if got else np.zeros(0, np.int64),
                np.concatenate([g[1] for g in got]) if got else np.zeros((0, s), np.int64))

    def times(self) -> list[np.ndarray]:
        """Each part's node times (nodes × scenarios), once settled."""
        return [r.times for r in self.replays]


def arrive(left: np.ndarray, time: np.ndarray, hub: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Count arrivals at ``hub`` (times ``t``: × scenarios) against each hub's members still to come (``left``) and its
    latest arrival so far (``time``), in place; the hubs whose last member just arrived."""
    np.maximum.at(time, hub, t)
    np.subtract.at(left, hub, 1)
    seen = np.unique(hub)
    return seen[left[seen] == 0]


def settle(hosts: Sequence[Host], members: np.ndarray, scenarios: int, local: np.ndarray | None = None
           ) -> tuple[np.ndarray, int]:
    """Drive ``hosts`` until every hub is released; ``members``: each hub's member count; ``local``: the hubs a host
    releases itself (all their members are on it), whose arrivals are reported and counted but not released again.
    Returns the hubs' times (hubs × scenarios) and the rounds it took. Raises ValueError where hubs are never
    released (a cycle through them)."""
    left = members.astype(np.int64).copy()
    time = np.full((members.size, scenarios), NONE, np.int64)
    released, at = np.zeros(0, np.int64), np.zeros((0, scenarios), np.int64)
    rounds = 0
    while True:
        got = [h.advance(released, at) for h in hosts]
        hub = np.concatenate([g[0] for g in got]) if got else np.zeros(0, np.int64)
        t = np.concatenate([g[1] for g in got]) if got else np.zeros((0, scenarios), np.int64)
        rounds += 1
        if hub.size == 0:
            break
        released = arrive(left, time, hub, t)
        if local is not None:
            released = released[~local[released]]
        at = time[released]
        if released.size == 0:  # (a host released its local hubs meanwhile, and reported what followed)
            break
    if (left > 0).any():
        raise ValueError(f"{int((left > 0).sum())} hubs never released: their members wait on each other")
    return time, rounds
