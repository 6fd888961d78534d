"""Engine profiles: the step-time model of one inference instance, its capacity and its options.

Step time of one continuous-batching step (chunked prefill), the *nominal law*::

    T = T0 + a*sum(P_new) + b*sum(P_new*(n_ctx + P_new/2)) + c*B_dec + d*sum(C_dec)

P_new: new prefill tokens of a request in this step; n_ctx: its tokens already in the KV cache
(the b term is prefill attention, quadratic in context); B_dec: decoding requests in the step;
C_dec: their context lengths (decode attention reads the whole KV cache). TokenPilot's latency
predictor is written from this law.

A profile may depart from it (``attention_growth_tokens`` > 0, ``noise_sigma`` > 0): this is the
*perturbed law* of the robustness runs, one the predictor was not written from::

    T = f * ( T0 + a*sum(P_new) + b*sum(P_new*m*(1 + m/L)) + c*B_dec + d*sum(C_dec*(1 + C_dec/L)) )

with m = n_ctx + P_new/2 (mean position of the new tokens) and L = ``attention_growth_tokens``:
attention per token pair grows with context (it has doubled at context L), super-linearly, in
prefill and in decode. f is a multiplicative noise factor, lognormal with mean 1 and standard
deviation ~``noise_sigma``, drawn once per planned (macro-)step from a generator seeded from the
instance id and ``EngineOptions.noise_seed`` (reproducible run to run; see ``sim/engine/instance.py``
for why one factor per macro-step keeps the closed form exact).

What the client sees of a step: every token reaches the client ``token_delay_s`` after the step
that made it ended (detokenization, the API server, the stream back; the network between data
centres is apart, ``Attempt.return_s``), the first token and the last alike, so TTFT and E2E
include it once and TPOT does not. It is 0 in the built-in profiles (their figures are the
engine's step times); a calibrated profile fits it to the TTFT the store recorded
(``sim/engine/calibration.py``) and the simulator applies it (``sim/engine/instance.py``). With
``token_delay_sigma`` > 0 each attempt's delay is ``token_delay_s`` times its own lognormal
factor (mean 1, standard deviation ~``token_delay_sigma``: the way back varies apart from the
engine's steps), from a generator of its own (the steps' noise draws the same with it or
without).

Where the figures come from (public sources, fitted by hand, bf16, vLLM-class engine):
- Decode (T0, c, d): ML.ENERGY leaderboard, vLLM on H100 80GB, median inter-token latency at
  fixed batch sizes (github.com/ml-energy/leaderboard, data/tasks/lm-arena-chat.json, 2026-02):
  Llama-3.1-8B 1xH100: 7.3 ms @ 8, 16.5 ms @ 128, 26.1 ms @ 256;
  Qwen3-14B 1xH100: 12.5 ms @ 8, 26.2 ms @ 128, 38.4 ms @ 256;
  Llama-3.1-70B TP4 H100: 16.6 ms @ 8, 27.9 ms @ 128, 39.8 ms @ 256 (chat-length contexts).
- Prefill (a, b): linear-layer cost from Microsoft Vidur's H100 operator profiles
  (github.com/microsoft/vidur, data/profiling/compute/h100, ~50k tok/s for a 7-8B model on one
  H100, ~18k tok/s for 70B at TP4) and NVIDIA NIM LLM benchmarks (TTFT at concurrency 1,
  docs.nvidia.com/nim/benchmarking/llm); b from attention FLOPs (4 * layers * hidden per token
  pair) at ~40 % of H100 bf16 peak.
- KV tokens: (0.9 * 80 GB * TP - weights - activations) / KV bytes per token, with KV bytes per
  token = 2 * layers * kv_heads * head_dim * 2 B from each model's config: 128 KiB (Llama-3-8B),
  160 KiB (Qwen3-14B), 320 KiB (Llama-3-70B, spread over 4 GPUs): ``kv_bytes_per_token``, what
  a prefill/decode transfer moves per prompt token.
- Scheduler limits: vLLM V1's ``max_num_seqs`` (1024 on an H100-class GPU for the OpenAI server)
  is ``max_seqs``; ``max_num_batched_tokens`` (8192 on H100-class GPUs) is
  ``prefill_budget_tokens`` -- a per-step budget that decode tokens consume too, unless
  ``EngineOptions.decode_tokens_in_budget`` is off (the simulator's older, prefill-only budget).

The perturbed profile ``llama3-8b-h100-perturbed`` (model ``llama3-8b``): T0 +8 %, a -16 %,
b +20 % with L = 32k tokens (1.2x the nominal prefill attention at short context, 2x near 22k),
c -14 %, d -21 % with the same growth (equal to the nominal d per token near 9k context, twice it
near 50k), noise sigma 0.10: cheaper than the nominal law on short requests, dearer on long ones.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from agents.policy.types import BLOCK_TOKENS

KvAllocation = Literal["on-demand", "reserve"]
EngineAdmission = Literal["first-chunk", "kv-fits"]


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """How the simulated engine schedules; the defaults are vLLM V1's behaviour.

    - ``kv_allocation``: ``"on-demand"`` (vLLM's paged allocation: blocks for each prompt chunk
      as it is scheduled and for the output as it grows, one block at a time; recompute
      pre-emption of the newest running request when a block is needed and none is free; full
      prompt blocks become shareable as soon as they are computed) or ``"reserve"`` (the
      simulator's older model: prompt + output budget reserved when the request is first
      scheduled, never pre-empted; prompt blocks shareable when its prefill completes).
    - ``decode_tokens_in_budget``: each decoding request consumes one token of the step's
      ``prefill_budget_tokens`` (vLLM's ``max_num_batched_tokens``); off: decodes are free and
      the budget is prefill-only (older model).
    - ``admission``: ``"first-chunk"`` (vLLM: a request leaves the waiting queue when its first
      prefill chunk is scheduled) or ``"kv-fits"`` (older model, with ``"reserve"`` only: it
      leaves the queue -- and counts as running -- as soon as its reservation fits, budget or
      not).
    - ``noise_seed``: seeds the per-instance step-time noise of profiles with ``noise_sigma`` > 0.
    """

    kv_allocation: KvAllocation = "on-demand"
    decode_tokens_in_budget: bool = True
    admission: EngineAdmission = "first-chunk"
    noise_seed: int = 0

    def __post_init__(self) -> None:
        if self.kv_allocation not in ("on-demand", "reserve"):
            raise ValueError(f"kv_allocation must be 'on-demand' or 'reserve', got {self.kv_allocation!r}")
        if self.admission not in ("first-chunk", "kv-fits"):
            raise ValueError(f"admission must be 'first-chunk' or 'kv-fits', got {self.admission!r}")
        if self.admission == "kv-fits" and self.kv_allocation != "reserve":
            raise ValueError("admission 'kv-fits' needs kv_allocation 'reserve'")

    @classmethod
    def legacy(cls) -> EngineOptions:
        """The simulator's behaviour before it followed vLLM V1 (with a profile's ``max_seqs``
        at 256, as it was): reservations, prefill-only budget, admission when KV fits."""
        return cls(kv_allocation="reserve", decode_tokens_in_budget=False, admission="kv-fits")


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Timing, capacity and scheduling options of one engine instance (seconds, tokens)."""

    name: str
    t0_s: float
    prefill_s_per_token: float
    prefill_s_per_token_pair: float
    decode_s_per_seq: float
    decode_s_per_context_token: float
    kv_tokens: int
    max_seqs: int = 1024
    prefill_budget_tokens: int = 8192
    attention_growth_tokens: float = 0.0  # L of the perturbed law; 0: the nominal (linear) law
    noise_sigma: float = 0.0  # multiplicative step-time noise; 0: none
    options: EngineOptions = field(default_factory=EngineOptions)
    gpus: int = 1  # GPUs one instance occupies (tensor parallelism)
    price_per_hour: float | None = None  # cost of one instance-hour; None: no price (GPU-hours only)
    kv_bytes_per_token: int = 128 * 1024  # the KV cache of one token (what a P/D transfer moves)
    token_delay_s: float = 0.0  # from the step that made a token to its client seeing it (law docstring)
    token_delay_sigma: float = 0.0  # the delay's per-attempt lognormal noise; 0: none (law docstring)
    kv_block_tokens: int = BLOCK_TOKENS  # the engine's KV allocation unit (vLLM's block_size)

    def __post_init__(self) -> None:
        """``kv_block_tokens`` divides the 512-token prefix block: one prefix block (the
        granularity of the prompt hashes) is a whole number of the engine's blocks. The cache
        holds ``kv_tokens // kv_block_tokens`` of them."""
        unit = self.kv_block_tokens
        if isinstance(unit, bool) or not isinstance(unit, int) or unit < 1 or BLOCK_TOKENS % unit:
            raise ValueError(f"kv_block_tokens must be a divisor of {BLOCK_TOKENS}, got {unit!r}")

    def prefill_chunk_s(self, new_tokens: int, cached_tokens: int) -> float:
        """The prefill terms of the step time for one request's chunk (before noise)."""
        mean_position = cached_tokens + new_tokens / 2
        pair = self.prefill_s_per_token_pair * new_tokens * mean_position
        if self.attention_growth_tokens > 0:
            pair *= 1 + mean_position / self.attention_growth_tokens
        return self.prefill_s_per_token * new_tokens + pair

    def decode_terms_s(self, sequences: int, context_sum: int, context_sq_sum: int = 0) -> float:
        """The decode terms of the step time for ``sequences`` decoders whose contexts sum to
        ``context_sum`` (and whose squares sum to ``context_sq_sum``; used by the perturbed law)."""
        growth = self.attention_growth_tokens
        attention = self.decode_s_per_context_token * context_sum
        if growth > 0:
            attention += self.decode_s_per_context_token * context_sq_sum / growth
        return self.decode_s_per_seq * sequences + attention

    def decode_alone_s(self, context: int, steps: int) -> float:
        """``steps`` decode steps of one request alone, its context growing from ``context``
        (before noise; closed form of the law above)."""
        total = 0.0
        if steps > 0:
            k = steps
            sums = k * context + k * (k - 1) / 2  # sum of contexts over the steps
            squares = k * context * context + context * k * (k - 1) + (k - 1) * k * (2 * k - 1) / 6
            total = k * (self.t0_s + self.decode_s_per_seq) + self.decode_s_per_context_token * sums
            if self.attention_growth_tokens > 0:
                total += self.decode_s_per_context_token * squares / self.attention_growth_tokens
        return total

    @property
    def noise_mu(self) -> float:
        """Location of the lognormal noise, so that its mean is 1."""
        return -self.noise_sigma * self.noise_sigma / 2

    @property
    def token_delay_mu(self) -> float:
        """Location of the lognormal factor of the delay, so that its mean is 1."""
        return -self.token_delay_sigma * self.token_delay_sigma / 2


H100_HOUR = 3.0
"""Default price of one H100-hour: a round on-demand list price (clouds list $2-4 per H100-hour
in 2025-26). Every profile below is priced at its GPUs x this; a fleet YAML overrides it per
data centre or instance group (``price_per_hour``, null for none)."""

_LLAMA_8B = EngineProfile(
    "llama3-8b-h100", 6.5e-3, 25e-6, 1e-9, 35e-6, 76e-9, 420_000, price_per_hour=H100_HOUR
)

PROFILES: dict[str, EngineProfile] = {
    p.name: p
    for p in (
        _LLAMA_8B,
        EngineProfile(
            "qwen3-14b-h100",
            12e-3,
            40e-6,
            2e-9,
            60e-6,
            95e-9,
            255_000,
            price_per_hour=H100_HOUR,
            kv_bytes_per_token=160 * 1024,
        ),
        EngineProfile(
            "llama3-70b-tp4-h100",
            17e-3,
            65e-6,
            2e-9,
            72e-6,
            48e-9,
            490_000,
            gpus=4,
            price_per_hour=4 * H100_HOUR,
            kv_bytes_per_token=320 * 1024,
        ),
        EngineProfile(
            "llama3-8b-h100-perturbed",
            t0_s=7.0e-3,
            prefill_s_per_token=21e-6,
            prefill_s_per_token_pair=1.2e-9,
            decode_s_per_seq=30e-6,
            decode_s_per_context_token=60e-9,
            kv_tokens=_LLAMA_8B.kv_tokens,
            attention_growth_tokens=32_768.0,
            noise_sigma=0.10,
            price_per_hour=H100_HOUR,
        ),
    )
}

PROFILE_MODELS: dict[str, str] = {
    "llama3-8b-h100": "llama3-8b",
    "qwen3-14b-h100": "qwen3-14b",
    "llama3-70b-tp4-h100": "llama3-70b",
    "llama3-8b-h100-perturbed": "llama3-8b",
}
"""The model each named profile serves (used when a fleet spec names no model)."""


@dataclass(frozen=True, slots=True)
class ProfileSet:
    """Named engine profiles and the model each serves: the built-in ones (``BUILT_IN``), or
    those joined with a profiles file's (``load_profiles``)."""

    profiles: Mapping[str, EngineProfile]
    models: Mapping[str, str]

    def get(self, name: str) -> EngineProfile:
        """The profile named ``name``; ``ValueError`` naming the known ones if none is."""
        try:
            return self.profiles[name]
        except KeyError:
            raise ValueError(f"unknown engine profile {name!r}; known: {', '.join(self.profiles)}") from None

    def model_of(self, profile: EngineProfile) -> str:
        """The model ``profile`` serves (its own name if none is recorded)."""
        return self.models.get(profile.name, profile.name)


BUILT_IN = ProfileSet(PROFILES, PROFILE_MODELS)


def get_profile(name: str) -> EngineProfile:
    return BUILT_IN.get(name)


def noise_seed(instance_id: str, profile: EngineProfile, options: EngineOptions) -> int:
    """The seed of one instance's step-time noise: stable across runs and processes."""
    return zlib.crc32(f"{profile.name}/{instance_id}/{options.noise_seed}".encode())


# --- profiles files ---------------------------------------------------------------------------

_LAW = (
    "t0_s",
    "prefill_s_per_token",
    "prefill_s_per_token_pair",
    "decode_s_per_seq",
    "decode_s_per_context_token",
)
# written when set:
_OPTIONAL_REALS = ("attention_growth_tokens", "noise_sigma", "token_delay_s", "token_delay_sigma")
_REALS = (*_LAW, *_OPTIONAL_REALS)
_COUNTS = {"kv_tokens": 1, "max_seqs": 1, "prefill_budget_tokens": 1, "gpus": 1}  # field: least value
_UNIT = "kv_block_tokens"  # an optional count, written when not BLOCK_TOKENS
_FILE_FIELDS = (*_LAW, "kv_tokens", "max_seqs", "prefill_budget_tokens", "gpus", "price_per_hour", "model")


def load_profiles(path: Path) -> ProfileSet:
    """The built-in profiles joined with those of the profiles file ``path`` (one of the same
    name replaces the built-in one); ``ValueError`` naming the file and what is wrong in one line.

    The file (as ``profiles_text`` writes it)::

        profiles:
          NAME:
            t0_s: 0.0065                    # the nominal law's T0, a, b, c, d (seconds)
            prefill_s_per_token: 2.5e-05
            prefill_s_per_token_pair: 1.0e-09
            decode_s_per_seq: 3.5e-05
            decode_s_per_context_token: 7.6e-08
            kv_tokens: 420000               # KV cache capacity in tokens
            max_seqs: 1024                  # optional: vLLM's max_num_seqs (default 1024)
            prefill_budget_tokens: 8192     # optional: max_num_batched_tokens (default 8192)
            gpus: 1                         # optional (default 1)
            price_per_hour: 3.0             # optional: an instance-hour; null: no price (default)
            model: llama3-8b                # optional: the model it serves (default: NAME)
            token_delay_s: 0.02             # optional: a token's way to the client (default 0)
            token_delay_sigma: 0.5          # optional: its noise per attempt (default 0: none)
            kv_block_tokens: 32             # optional: vLLM's block_size, divides 512 (default 512)

    ``attention_growth_tokens`` and ``noise_sigma`` (the perturbed law) are accepted too. A
    profile named after a built-in one may leave out any field: it keeps the built-in one's.
    """
    try:
        doc: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read profiles file {path}: {' '.join(str(exc).split())}") from None
    entries = doc.get("profiles") if isinstance(doc, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise ValueError(f"{path}: expected a mapping 'profiles' of NAME -> profile fields")
    profiles, models = dict(PROFILES), dict(PROFILE_MODELS)
    for name, entry in entries.items():
        profile, model = _profile_from_entry(str(name), entry, f"{path}: profile {name!r}")
        profiles[profile.name], models[profile.name] = profile, model
    return ProfileSet(profiles, models)


def _profile_from_entry(name: str, entry: Any, where: str) -> tuple[EngineProfile, str]:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a mapping of fields")
    unknown = sorted(set(map(str, entry)) - set(_FILE_FIELDS) - set(_REALS) - {_UNIT})
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; known: {', '.join((*_FILE_FIELDS, _UNIT))}")
    base = PROFILES.get(name)
    missing = [f for f in (*_LAW, "kv_tokens") if f not in entry] if base is None else []
    if missing:
        raise ValueError(
            f"{where}: missing {', '.join(missing)} (a profile of a new name needs the law and kv_tokens)"
        )
    values: dict[str, Any] = {}
    for key in _REALS:
        if key in entry:
            value = entry[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ValueError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
            values[key] = float(value)
    for key, least in {**_COUNTS, _UNIT: 1}.items():
        if key in entry:
            value = entry[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{where}: {key} must be an integer >= {least}, got {value!r}")
            values[key] = value
    if "price_per_hour" in entry:
        price = entry["price_per_hour"]
        if price is not None and (
            isinstance(price, bool) or not isinstance(price, int | float) or not 0 <= price < math.inf
        ):
            raise ValueError(f"{where}: price_per_hour must be a number >= 0 or null, got {price!r}")
        values["price_per_hour"] = None if price is None else float(price)
    model = entry.get("model", PROFILE_MODELS.get(name, name))
    if not isinstance(model, str) or not model:
        raise ValueError(f"{where}: model must be a name, got {model!r}")
    try:
        profile = replace(base, **values) if base is not None else EngineProfile(name=name, **values)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return profile, model


def profiles_text(profiles: Mapping[str, EngineProfile], models: Mapping[str, str]) -> str:
    """``profiles`` (by name) as a profiles file ``load_profiles`` reads, each with the model
    ``models`` names for it (default: its name); the perturbed law's fields and
    ``token_delay_s`` only when set, ``kv_block_tokens`` only when not 512."""
    entries: dict[str, dict[str, Any]] = {}
    for name, profile in profiles.items():
        entry: dict[str, Any] = {}
        for key in (*_FILE_FIELDS[:-1], *_OPTIONAL_REALS):
            value = getattr(profile, key)
            if key in _COUNTS:
                entry[key] = int(value)
            elif value is not None and (value or key not in _OPTIONAL_REALS):
                entry[key] = float(value)  # plain floats (numpy's would not dump)
            elif key == "price_per_hour":
                entry[key] = None
        if profile.kv_block_tokens != BLOCK_TOKENS:
            entry[_UNIT] = int(profile.kv_block_tokens)
        entry["model"] = models.get(name, name)
        entries[name] = entry
    return yaml.safe_dump({"profiles": entries}, sort_keys=False)
