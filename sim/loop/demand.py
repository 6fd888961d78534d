"""Demand as a planner sees it in the simulator: what arrived, what admission did, what ended.

Per ``(model, version, home DC)`` since the last plan (``DemandSample``): first attempts (a
retry is not new demand) with their prompt tokens and output budgets; how many admission held
(queued at least once) or rejected; the completions with their output tokens and whether they
met their objective. Beside it, arrivals per model per ``step_s`` for the run's timeline.
"""

from __future__ import annotations

from collections import defaultdict

from agents.policy.planners.contract import DemandSample


class DemandLedger:
    def __init__(self, start_s: float, step_s: float) -> None:
        self.start_s = start_s
        self.step_s = step_s
        self._since = start_s
        self._samples: dict[tuple[str, str, str], DemandSample] = {}
        self._per_step: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))

    def _sample(self, model: str, version: str, home_dc: str) -> DemandSample:
        key = (model, version, home_dc)
        sample = self._samples.get(key)
        if sample is None:
            sample = self._samples[key] = DemandSample(model, version, home_dc, self._since, self._since)
        return sample

    def arrived(
        self, model: str, version: str, home_dc: str, input_tokens: int, budget: int, now: float
    ) -> None:
        sample = self._sample(model, version, home_dc)
        sample.arrivals += 1
        sample.input_tokens += input_tokens
        sample.output_budget += budget
        self._per_step[model][int((now - self.start_s) // self.step_s)] += 1

    def held(self, model: str, version: str, home_dc: str) -> None:
        self._sample(model, version, home_dc).held += 1

    def rejected(self, model: str, version: str, home_dc: str) -> None:
        self._sample(model, version, home_dc).rejected += 1

    def completed(
        self,
        model: str,
        version: str,
        home_dc: str,
        input_tokens: int,
        cached_tokens: int,
        output_tokens: int,
        met: bool,
    ) -> None:
        sample = self._sample(model, version, home_dc)
        sample.completed += 1
        sample.cached_tokens += cached_tokens
        sample.met_slo += int(met)
        sample.met_input_tokens += input_tokens if met else 0
        sample.output_tokens += output_tokens
        sample.completed_input_tokens += input_tokens

    def take(self, now: float) -> tuple[DemandSample, ...]:
        """The samples since the last ``take`` (each ending ``now``), and start new ones."""
        samples = tuple(self._samples.values())
        for sample in samples:
            sample.start_s, sample.end_s = self._since, now
        self._samples = {}
        self._since = now
        return samples

    def per_step(self, steps: int) -> dict[str, list[float]]:
        """Arrivals per second of each model over each of the first ``steps`` steps."""
        return {
            model: [round(counts.get(k, 0) / self.step_s, 3) for k in range(steps)]
            for model, counts in sorted(self._per_step.items())
        }
