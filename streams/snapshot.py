"""Adapters between wire events / table contents and what the pure policy core reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from agents.policy import types as policy
from agents.policy.common.slo import classify
from schemas.events import Completion, Heartbeat, InferenceRequest, KvEvent


def cluster_view(states: Mapping[str, Mapping[str, Any]]) -> policy.ClusterView:
    """A struct-of-arrays snapshot from a pool's instance-state entries (Heartbeat dicts).

    Rows are sorted by instance id so the same table contents always give the same view.
    """
    beats = [Heartbeat.model_validate(states[iid]) for iid in sorted(states)]
    return policy.ClusterView(
        instance_ids=tuple(b.instance_id for b in beats),
        dc=np.array([b.dc for b in beats], dtype=str),
        model=np.array([b.model for b in beats], dtype=str),
        version=np.array([b.model_version for b in beats], dtype=str),
        profile=np.array([b.profile for b in beats], dtype=str),
        ready=np.array([b.endpoint_ready for b in beats], dtype=bool),
        waiting=np.array([b.waiting for b in beats], dtype=np.int64),
        running=np.array([b.running for b in beats], dtype=np.int64),
        tokens_in_flight=np.array([b.tokens_in_flight for b in beats], dtype=np.int64),
        kv_used=np.array([b.kv_blocks_used for b in beats], dtype=np.int64),
        kv_total=np.array([b.kv_blocks_total for b in beats], dtype=np.int64),
        last_heartbeat_s=np.array([b.ts for b in beats], dtype=np.float64),
    )


def request_view(request: InferenceRequest) -> policy.RequestView:
    """What a policy may know of a request: never ``true_output_tokens`` (emulation only)."""
    return policy.RequestView(
        request_id=request.request_id,
        attempt=request.attempt,
        tenant=request.tenant,
        model=request.model,
        slo_class=classify(request.input_tokens, request.slo_class),
        input_tokens=request.input_tokens,
        output_budget=request.output_budget,
        block_hashes=request.prompt_block_hashes,
        arrival_s=request.ts,
        deadline_s=request.deadline_ts,
        task_type=request.task_type,
    )


def policy_completion(event: Completion) -> policy.Completion:
    status: policy.CompletionStatus = event.status
    return policy.Completion(
        request_id=event.request_id,
        attempt=event.attempt,
        instance_id=event.instance_id,
        status=status,
        input_tokens=event.input_tokens,
        cached_tokens=event.cached_tokens,
        output_tokens=event.output_tokens,
        ttft_s=event.ttft_s,
        tpot_s=event.tpot_s,
        time_s=event.ts,
    )


def policy_kv_event(event: KvEvent) -> policy.KvEvent:
    return policy.KvEvent(event.instance_id, event.kind, event.block_hashes, event.ts)
