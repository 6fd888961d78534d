"""The default admission and DC-selection stages: what a scheduler does without SLOMax / FleetMind."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agents.policy.types import (
    Admission,
    BoolArray,
    ClusterView,
    DcChoice,
    Observation,
    RequestView,
)


class PassThrough:
    """Admission ``pass-through``: admit every request at once (no classes, no quotas)."""

    name = "pass-through"
    wants_kv_events = False
    admits_as_offered = True  # (``AdmitsAsOffered``: the router may order a batch)

    def __init__(self, seed: int = 0) -> None:
        del seed  # no randomness; the registry passes every stage its seed

    def admit(self, requests: Sequence[RequestView], view: ClusterView, now_s: float) -> list[Admission]:
        return [Admission("admit", "pass-through")] * len(requests)

    def observe(self, event: Observation) -> None:
        pass


class HomeDc:
    """DC selection ``home-dc``: the request's home DC if it can serve it, else any allowed DC.

    candidates = ready ∧ model == request.model ∧ (version == request.model_version, if it names
    one) ∧ DC reachable ∧ (DC ∈ allowed_regions, if any); if some candidate is in
    ``request.home_dc``, only those; none: the request is held (until its version is served, or
    its hold times out). Masks are computed once per snapshot version and (model, version,
    allowed regions, home DC): string compares over a large pool are among the costliest steps
    of a decision.
    """

    name = "home-dc"
    wants_kv_events = False

    def __init__(self, seed: int = 0) -> None:
        del seed
        self._version = -1
        self._choices: dict[tuple[str, str, tuple[str, ...], str], DcChoice] = {}

    def select(self, request: RequestView, view: ClusterView, now_s: float) -> DcChoice:
        if view.version != self._version:
            self._version, self._choices = view.version, {}
        key = (request.model, request.model_version, request.allowed_regions, request.home_dc)
        choice = self._choices.get(key)
        if choice is None:
            choice = self._choices[key] = self._choose(request, view)
        return choice

    def _choose(self, request: RequestView, view: ClusterView) -> DcChoice:
        allowed: BoolArray = view.serving_rows(request) & view.reachable_rows()
        if request.allowed_regions:
            allowed &= np.isin(view.dc, request.allowed_regions)
        if request.home_dc:
            home = allowed & (view.dc == request.home_dc)
            if home.any():
                return DcChoice(request.home_dc, home, "home data centre")
        if not allowed.any():
            what = f"version {request.model_version} of the model" if request.model_version else "the model"
            return DcChoice("", allowed, f"no ready instance of {what} in an allowed data centre")
        return DcChoice("", allowed, "any allowed data centre")

    def observe(self, event: Observation) -> None:
        pass
