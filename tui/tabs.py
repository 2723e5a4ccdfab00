"""The tabs of ``tracekit inspect``: every view, in tab order. Its own module, above the views: each view module
imports only the view contract (:mod:`tracekit.tui.views`), and the app asks this list."""

from __future__ import annotations

from tracekit.tui.collectives_view import CollectivesView
from tracekit.tui.critical_path_view import CriticalPathView
from tracekit.tui.diff_view import DiffView
from tracekit.tui.hang_view import HangView
from tracekit.tui.iterations import IterationsView
from tracekit.tui.ops_view import OpsView
from tracekit.tui.overview import OverviewView
from tracekit.tui.tensors_view import TensorsView
from tracekit.tui.timeline_view import TimelineView
from tracekit.tui.topology_view import TopologyView
from tracekit.tui.views import View
from tracekit.tui.whatif_view import WhatIfView


def view_classes() -> list[type[View]]:
    """Every view, in tab order."""
    return [OverviewView, HangView, IterationsView, TimelineView, CriticalPathView, CollectivesView, WhatIfView,
            TensorsView, OpsView, DiffView, TopologyView]
