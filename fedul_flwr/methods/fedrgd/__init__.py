"""FedRGD (Zhang et al., IEEE BigData 2021): ``method = "fedrgd"`` (:mod:`.fedrgd`), with its
grouping-based model averaging (:mod:`.grouping`). Runs in its own labels-at-server setting and,
as FedDB's Tables 1-3 run it, with the labels at the clients.
"""

from __future__ import annotations

from fedul_flwr.methods.fedrgd.fedrgd import FedRGD

__all__ = ["FedRGD"]
