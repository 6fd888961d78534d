"""The engine inventory: which vLLM servers exist, what they serve, where, and how to reach them.

A YAML file, one for the worker, the dispatcher and the gateway::

    models:
      tiny-llama:                     # the model pool: requests name it in "model"
        version: v1                   # what instances of it must serve (optional)
        tokenizer: /srv/models/tiny   # a directory with tokenizer.json (+ tokenizer_config.json
                                      # for the chat template); optional
    instances:
      - id: vllm-0
        url: http://10.0.0.5:8000     # OpenAI-compatible server: /v1/*, /metrics, /health
        model: tiny-llama
        version: v1                   # default: the model's version
        dc: eu-west                   # default: "local"
        served_model_name: tiny-llama # what the engine calls the model (default: model)
        kv_events: tcp://10.0.0.5:5557  # vLLM's ZMQ KV-event publisher (optional)
        kv_replay: tcp://10.0.0.5:5558  # its replay endpoint (optional)
        gpus: 1                       # GPUs the server holds (default 1)
        price_per_hour: 3.0           # what an hour of it costs (default: none, GPU-hours only)
        role: both                    # prefill, decode or both (default): its part in
                                      # prefill/decode disaggregation (its --kv-transfer-config)
        kv_bytes_per_token: 131072    # KV-cache bytes of one prompt token (default 0: unknown)
        max_num_seqs: 32              # the server's --max-num-seqs (default 0: unknown)
        max_num_batched_tokens: 2048  # its --max-num-batched-tokens (default 0: unknown)

The price is what the cost figures (``cost_per_minute`` in ClickHouse) charge for the instance,
whatever it does; without one they report GPU-seconds only. The scheduler's limits travel in
the instance's heartbeats (``max_seqs``, ``prefill_budget_tokens``), for a replay's calibration.
``load_inventory`` raises ``InventoryError`` with one line saying what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlparse

import yaml

from schemas.events import MAX_COUNT, ROLES, Role


class InventoryError(ValueError):
    """The inventory file is missing, unreadable or invalid (the message says where)."""


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    version: str = ""
    tokenizer: Path | None = None


@dataclass(frozen=True, slots=True)
class InstanceEntry:
    instance_id: str
    url: str  # without a trailing slash
    model: str
    version: str
    dc: str = "local"
    served_model_name: str = ""
    kv_events: str | None = None
    kv_replay: str | None = None
    gpus: int = 1
    price_per_hour: float | None = None  # None: no price (GPU-hours only)
    role: Role = "both"
    kv_bytes_per_token: int = 0  # 0: not known
    max_num_seqs: int = 0  # 0: not known
    max_num_batched_tokens: int = 0  # 0: not known


@dataclass(frozen=True, slots=True)
class Inventory:
    models: dict[str, ModelEntry] = field(default_factory=dict)
    instances: tuple[InstanceEntry, ...] = ()

    def instance(self, instance_id: str) -> InstanceEntry | None:
        return next((i for i in self.instances if i.instance_id == instance_id), None)

    def tokenizer_dirs(self) -> dict[str, Path]:
        """Model pool -> its tokenizer directory, for the models that name one."""
        return {m.name: m.tokenizer for m in self.models.values() if m.tokenizer is not None}


def load_inventory(path: Path | str) -> Inventory:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise InventoryError(f"cannot read the inventory {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise InventoryError(f"the inventory {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    return parse_inventory(raw, str(path), base=Path(path).parent)


def parse_inventory(raw: Any, where: str = "inventory", base: Path | None = None) -> Inventory:
    if not isinstance(raw, dict):
        raise InventoryError(f"{where}: expected a mapping with 'models' and 'instances'")
    unknown = set(raw) - {"models", "instances"}
    if unknown:
        raise InventoryError(f"{where}: unknown keys {sorted(unknown)}")
    models: dict[str, ModelEntry] = {}
    for name, spec in (raw.get("models") or {}).items():
        spec = spec or {}
        _keys(spec, {"version", "tokenizer"}, f"{where}: models.{name}")
        tokenizer = spec.get("tokenizer")
        path = None if tokenizer is None else Path(str(tokenizer))
        if path is not None and base is not None and not path.is_absolute():
            path = base / path
        models[str(name)] = ModelEntry(str(name), str(spec.get("version", "")), path)
    instances: list[InstanceEntry] = []
    items = raw.get("instances") or []
    if not isinstance(items, list) or not items:
        raise InventoryError(f"{where}: 'instances' must be a non-empty list")
    for index, spec in enumerate(items):
        at = f"{where}: instances[{index}]"
        if not isinstance(spec, dict):
            raise InventoryError(f"{at}: expected a mapping")
        _keys(
            spec,
            {"id", "url", "model", "version", "dc", "served_model_name", "kv_events", "kv_replay", "gpus"}
            | {"price_per_hour", "role", *_COUNTS},
            at,
        )
        for required in ("id", "url", "model"):
            if not spec.get(required):
                raise InventoryError(f"{at}: '{required}' is required")
        url = str(spec["url"]).rstrip("/")
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise InventoryError(f"{at}: url {url!r} is not an http(s) URL")
        model = str(spec["model"])
        entry = models.setdefault(model, ModelEntry(model))
        instances.append(
            InstanceEntry(
                instance_id=str(spec["id"]),
                url=url,
                model=model,
                version=str(spec.get("version", entry.version)),
                dc=str(spec.get("dc", "local")),
                served_model_name=str(spec.get("served_model_name", model)),
                kv_events=_zmq(spec.get("kv_events"), f"{at}: kv_events"),
                kv_replay=_zmq(spec.get("kv_replay"), f"{at}: kv_replay"),
                gpus=_gpus(spec.get("gpus", 1), f"{at}: gpus"),
                price_per_hour=_price(spec.get("price_per_hour"), f"{at}: price_per_hour"),
                role=_role(spec.get("role", "both"), f"{at}: role"),
                **{key: _count(spec.get(key, 0), f"{at}: {key}") for key in _COUNTS},
            )
        )
    ids = [i.instance_id for i in instances]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise InventoryError(f"{where}: duplicate instance ids {duplicated}")
    return Inventory(models, tuple(instances))


def dump_inventory(inventory: Inventory) -> str:
    """The YAML of ``inventory`` (what ``load_inventory`` reads back)."""
    models = {
        m.name: {
            k: v for k, v in (("version", m.version), ("tokenizer", m.tokenizer and str(m.tokenizer))) if v
        }
        for m in inventory.models.values()
    }
    instances = [
        {
            k: v
            for k, v in (
                ("id", i.instance_id),
                ("url", i.url),
                ("model", i.model),
                ("version", i.version),
                ("dc", i.dc),
                ("served_model_name", i.served_model_name),
                ("kv_events", i.kv_events),
                ("kv_replay", i.kv_replay),
                ("gpus", i.gpus if i.gpus != 1 else None),
                ("price_per_hour", i.price_per_hour),
                ("role", i.role if i.role != "both" else None),
                ("kv_bytes_per_token", i.kv_bytes_per_token or None),
                ("max_num_seqs", i.max_num_seqs or None),
                ("max_num_batched_tokens", i.max_num_batched_tokens or None),
            )
            if v is not None and v != ""
        }
        for i in inventory.instances
    ]
    return yaml.safe_dump({"models": models, "instances": instances}, sort_keys=False)


def _keys(spec: Any, allowed: set[str], at: str) -> None:
    if not isinstance(spec, dict):
        raise InventoryError(f"{at}: expected a mapping")
    unknown = set(spec) - allowed
    if unknown:
        raise InventoryError(f"{at}: unknown keys {sorted(unknown)} (known: {sorted(allowed)})")


def _zmq(value: Any, at: str) -> str | None:
    if value in (None, ""):
        return None
    text = str(value)
    if not text.startswith(("tcp://", "ipc://")):
        raise InventoryError(f"{at}: {text!r} is not a ZMQ endpoint (tcp://host:port)")
    return text


def _gpus(value: Any, at: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
        raise InventoryError(f"{at}: {value!r} is not a whole number of GPUs in [1, 1024]")
    return value


def _price(value: Any, at: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e6:
        raise InventoryError(f"{at}: {value!r} is not a price per hour in [0, 1e6)")
    return float(value)


def _role(value: Any, at: str) -> Role:
    if value not in ROLES:
        raise InventoryError(f"{at}: {value!r} is not one of {', '.join(ROLES)}")
    return cast(Role, value)


_COUNTS = ("kv_bytes_per_token", "max_num_seqs", "max_num_batched_tokens")
"""An instance's optional whole-number fields, named as in the file and in ``InstanceEntry``."""


def _count(value: Any, at: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise InventoryError(f"{at}: {value!r} is not a whole number in [0, {MAX_COUNT}]")
    return value
