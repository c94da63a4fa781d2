"""The fault-by-configuration matrix, generated: every topology with every combination of the
settings that change a code path (signing, auth, an ACL user: where they apply), each cell one
chaos run under every fault kind of its topology, checked by the history checker.

The bounded profile (the test command) runs the cells that give each setting and each topology
both of its values at least once; ``python -m tests.chaos --matrix`` runs them all.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .harness import TOPOLOGIES, Settings, Topology


@dataclass(frozen=True)
class Cell:
    topology: Topology
    settings: Settings

    @property
    def name(self) -> str:
        return f"{self.topology}-{self.settings.name()}"


def applies(topology: Topology, settings: Settings) -> bool:
    """An ACL user is set up on the proxied topology's server only."""
    return topology == "proxied" or not settings.acl


CELLS: tuple[Cell, ...] = tuple(
    Cell(topology, Settings(signing, auth, acl))
    for topology in TOPOLOGIES
    for signing, auth, acl in itertools.product((False, True), repeat=3)
    if applies(topology, Settings(signing, auth, acl))
)
BOUNDED: tuple[Cell, ...] = (
    Cell("proxied", Settings(signing=True, auth=True, acl=True)),
    Cell("sentinel", Settings()),
)
