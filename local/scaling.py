"""What a stack started with ``--planner`` follows and writes: the server slots it may run
(``Scaling``), the dispatcher's inventory of the servers that run (``write_engines``) and the
planner's fleet file (``fleet_document``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infra.files import write_atomic
from infra.vllm.inventory import Inventory, dump_inventory, load_inventory
from schemas.events import Role

ENGINES_FILE = "engines.yaml"  # with --planner: the dispatcher's inventory, the servers it drives
FLEET_FILE = "fleet.yaml"  # with --planner: the planner's fleet file
MIN_REPLICAS = 1  # a planned stack keeps at least one server: the gateway always has an engine


@dataclass
class Scaling:
    """What the supervisor follows with ``--planner`` (``local/follower.py``): the plans for
    ``model`` at ``version`` in ``dc`` from ``planner``, between ``MIN_REPLICAS`` and
    ``len(servers)`` servers; ``servers`` are the slots (part names), the first ``initial``
    started with the stack. ``inventory``: every slot (the gateway's); ``engines_file``: the
    dispatcher's, rewritten as servers start and drain; ``fleet_file``: the planner's
    (``fleet_document``), its load time ``load_s`` until the stack's servers were timed.
    A draining server stops once its heartbeats (every ``heartbeat_s``) said it idle for
    ``drain_grace_s``."""

    planner: str
    model: str
    version: str
    dc: str
    servers: list[str]
    initial: int
    inventory: str
    engines_file: str
    fleet_file: str
    profile: str
    gpus_per_server: int
    load_s: float
    heartbeat_s: float
    drain_grace_s: float


def write_engines(scaling: Scaling, servers: Mapping[str, Role]) -> None:
    """The dispatcher's inventory: the gateway's (``scaling.inventory``, every slot) with only
    ``servers`` (started, not draining), each in the role it was started in."""
    everything = load_inventory(scaling.inventory)
    chosen = tuple(
        dataclasses.replace(i, role=servers[i.instance_id])
        for i in everything.instances
        if i.instance_id in servers
    )
    write_atomic(Path(scaling.engines_file), dump_inventory(Inventory(everything.models, chosen)))


def fleet_document(scaling: Scaling, load_s: float) -> dict[str, Any]:
    """The planner's fleet file (``sim/engine/fleet.py``): one DC whose GPU budget is every
    slot's GPUs, the servers that start with the stack, and the model with its floor
    (``MIN_REPLICAS``) and load time ``load_s`` (cold and warm alike: nothing is staged here)."""
    group = {"count": scaling.initial, "profile": scaling.profile, "model": scaling.model}
    if scaling.version:
        group["version"] = scaling.version
    return {
        "data_centres": [
            {
                "name": scaling.dc,
                "gpus": len(scaling.servers) * scaling.gpus_per_server,
                "instances": [group],
            }
        ],
        "models": {
            scaling.model: {
                "load_s": {"cold": round(load_s, 1), "warm": round(load_s, 1)},
                "min_replicas": MIN_REPLICAS,
                "profile": scaling.profile,
            }
        },
    }


def fleet_yaml(scaling: Scaling, load_s: float) -> str:
    head = (
        f"# The fleet {scaling.planner!r} plans for, written by tokenfleet up --planner: "
        f"{len(scaling.servers)} server slots of {scaling.gpus_per_server} GPU(s).\n"
    )
    return head + yaml.safe_dump(fleet_document(scaling, load_s), sort_keys=False)
