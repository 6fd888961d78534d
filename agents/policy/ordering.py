"""In which order a batch of admitted arrivals is placed.

The router's predictions assume the engines receive requests in the order they were decided,
so the order a batch is placed in is a decision of its own:

- behind an admission stage whose answers do not depend on the offer's order
  (``AdmitsAsOffered``), the router's own order if it has one (``OrdersBatch.order``);
- behind any other admission (it judged each request behind those it admitted before it), its
  order, with the long-context arrivals first while the router would reorder (``long_first``),
  so that the short ones go around a long prefill rather than wait behind it.

Held requests offered again keep the order they were held in: only arrivals are arranged.
"""

from __future__ import annotations

from collections.abc import Sequence

from agents.policy.common.slo import LONG_CONTEXT
from agents.policy.stages import AdmissionStage, AdmitsAsOffered, InstanceSelectionStage, OrdersBatch
from agents.policy.types import BoolArray, ClusterView, RequestView


class ArrivalOrder:
    """The placement order of a batch of arrivals (module docstring), for one pair of stages."""

    def __init__(self, admission: AdmissionStage, router: InstanceSelectionStage) -> None:
        self._router = router if isinstance(router, OrdersBatch) else None
        as_offered = isinstance(admission, AdmitsAsOffered) and admission.admits_as_offered
        self._router_orders = self._router if as_offered else None

    def long_first(self, view: ClusterView) -> bool:
        """Whether an instant's long-context arrivals are placed before its short ones: while the
        router decides a burst on ``view`` largest first (``OrdersBatch.reorders``)."""
        return self._router is not None and self._router.reorders(view)

    def arrange(
        self, requests: Sequence[RequestView], candidates: Sequence[BoolArray], view: ClusterView
    ) -> list[int]:
        """The batch's indices in placement order."""
        if self._router_orders is not None:
            return self._router_orders.order(requests, candidates, view)
        indices = list(range(len(requests)))
        if self.long_first(view):  # admission's order within each class (a stable sort)
            indices.sort(key=lambda i: requests[i].slo_class != LONG_CONTEXT)
        return indices
