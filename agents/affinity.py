"""Hot prefixes spread over the deciders, on the wire: ``HotKeys`` (the rule, in
``agents/policy/common/hot_keys.py``) applied to an ``InferenceRequest`` by its publisher (the
gateway, ``RequestClient``, the worker's batch expansion)."""

from __future__ import annotations

from agents.policy.common.hot_keys import HOT_PREFIX_RATE_PER_S, HOT_PREFIX_SPREAD, SPREAD_MARK, HotKeys
from schemas.events import InferenceRequest

__all__ = ["HOT_PREFIX_RATE_PER_S", "HOT_PREFIX_SPREAD", "SPREAD_MARK", "HotPrefixes"]


class HotPrefixes(HotKeys):
    """``HotKeys`` over requests' affinity keys."""

    def place(self, request: InferenceRequest, now_s: float) -> InferenceRequest:
        """``request`` as its publisher should send it: counted, and spread if its key is hot
        (a request whose publisher chose its affinity already is left as it is)."""
        if request.affinity:
            return request
        affinity = self.affinity(request.affinity_key, request.request_id, now_s)
        return request.model_copy(update={"affinity": affinity}) if affinity else request
