"""The replay shown on engines: predict a policy's run from another's, then run it for real.

``python -m bench.replay [--engines vllm|emulated] [--duration S] [--users N] [--speed X]
[--seed N] [--draws N] [--shared-broker] [--data DIR] [--json J]``

1. Policy A (``round-robin``) runs for real: per policy an embedded broker and an
   ``EngineStack`` (worker with the embedded ClickHouse store, dispatcher, gateway) whose rows
   carry a run id, and the ``openai`` client load of ``make demo-vllm`` (``lab.demo_vllm.load``:
   ``--users`` users, each a tenant with a long system prompt of its own, streamed chats of
   16-64 tokens, ``--duration`` seconds, seeded by ``--seed``). ``--shared-broker``: one broker
   for every run, as ``make demo-vllm`` runs them. Engines: two vLLM CPU servers on the
   tiny model (``make engine``), or two emulated vLLM servers (``local.emulated_vllm``) running
   the perturbed profile ``llama3-8b-h100-perturbed`` at ``--speed`` (emulated time runs X times
   faster than the clock).
2. ``tokenfleet replay --run RUN --policy ...`` (the command line, in its own process) reads that
   run from the store, calibrates its engines and predicts A itself and B (``tokenpilot``); with
   emulated engines also C (``least-tokens``), and beside the calibrated prediction the nominal
   one: the same replay on ``llama3-8b-h100`` (the law the perturbed one departs from), its step
   times divided by ``--speed`` (the nominal law on the emulated clock). The calibrated
   prediction is replayed ``--draws`` times (seeds from ``--seed``; the engines' fitted noise
   differs from one draw to the next) and each figure predicted is its median over them.
3. B (and C) run for real on the same load (same seed; vLLM's prefix caches reset, emulated
   servers started afresh).
4. Errors, each (predicted - observed) / observed, signed: ``self_error`` (A's prediction against
   A's run), ``counterfactual_error`` (B's prediction, made from A's run, against B's run), each
   with ``goodput``, ``ttft_p50``, ``ttft_p95``; per policy ``errors`` (calibrated and, emulated,
   nominal). Observed figures are the store's as ``tokenfleet replay`` of each run reads them
   (``infra/clickhouse/summary.py``: the simulator's definitions); that replay's own
   ``self_error`` is kept too (``own_replay_error``).

Also, per policy, where the replay put the requests (``placement``: each instance's share of
the requests and of the prompt tokens it found cached) beside what the engines counted in the
real run (``engines``: prefix-cache tokens queried and hit), for the question whether a policy's
concentration on one engine is what the load calls for.

Figures to stdout (the replay's own tables first), progress to stderr; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.vllm.inventory import dump_inventory
from lab.replay_engines import EmulatedServers, PolicyRun, run_policy
from lab.stack import broker
from local.tiny_model import ensure_tiny_model
from local.vllm_launcher import VllmServers, engine_python_or_none, server_specs

if TYPE_CHECKING:
    from sim.engine.attempt import Attempt
    from sim.engine.fleet import FleetSpec
    from sim.engine.profiles import EngineProfile
    from sim.workloads.trace import Workload

MODEL = "tiny-llama"
RAN, COUNTERFACTUAL, THIRD = "round-robin", "tokenpilot", "least-tokens"
EMULATED_PROFILE = "llama3-8b-h100-perturbed"
NOMINAL_PROFILE = "llama3-8b-h100"
SERVERS = 2
ERROR_KEYS = ("goodput", "ttft_p50", "ttft_p95")
FIGURES = {"goodput": "goodput_tokens_per_s", "ttft_p50": "ttft_p50_s", "ttft_p95": "ttft_p95_s"}
TARGETS: dict[str, dict[str, dict[str, float]]] = {
    "vllm": {
        "self_error": {"goodput": 0.10, "ttft_p50": 0.20},
        "counterfactual_error": {"goodput": 0.15, "ttft_p50": 0.25},
    },
    "emulated": {"calibrated_goodput": {RAN: 0.05, COUNTERFACTUAL: 0.05, THIRD: 0.05}},
}
"""The issue's targets: the largest absolute relative error allowed per figure."""


@dataclass(frozen=True)
class BenchOptions:
    engines: str = "vllm"
    duration_s: float = 60.0
    users: int = 8
    seed: int = 0
    speed: float = 0.2
    """Emulated engines only: emulated time runs this many times faster than the clock."""
    data_dir: Path | None = None
    """Where the store, logs and inventories go (None: a temporary directory, removed)."""
    shared_broker: bool = False
    """One broker for every policy's run, as ``make demo-vllm`` runs them (default: one each)."""
    draws: int = 5
    """Replays of A's run (``tokenfleet replay --draws``): the prediction is their median."""

    def policies(self) -> tuple[str, ...]:
        return (RAN, COUNTERFACTUAL, THIRD) if self.engines == "emulated" else (RAN, COUNTERFACTUAL)


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Steps 1-4 of the module docstring; the JSON document (``self_error``,
    ``counterfactual_error``, ``errors``, ``observed``, ``predicted``, ``targets``, ``met``, ...)."""
    if options.engines not in ("vllm", "emulated"):
        raise ValueError(f"--engines {options.engines!r}: give vllm or emulated")
    with contextlib.ExitStack() as stack:
        data = options.data_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-replay-"))
        )
        data = data.resolve()
        data.mkdir(parents=True, exist_ok=True)
        return _run(options, data, stack)
    raise AssertionError("unreachable")


def _run(options: BenchOptions, data: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    store_url = f"chdb:///{data / 'clickhouse'}"
    model_dir = ensure_tiny_model(data / "model", MODEL)
    vllm = stack.enter_context(_vllm_servers(data, model_dir)) if options.engines == "vllm" else None
    policies = options.policies()
    shared = (
        stack.enter_context(broker(partitions=4, log_path=data / "tansu.log"))
        if options.shared_broker
        else None
    )
    runs: dict[str, PolicyRun] = {}
    replays: dict[str, dict[str, Any]] = {}
    nominal: dict[str, Any] | None = None
    placement: dict[str, Any] = {}
    for policy in policies:
        # A broker of its own per run by default: a new dispatcher reads tf.decisions from its
        # start and counts the gateway-run requests of an earlier run there as still in flight.
        with (
            broker(shared, partitions=4, log_path=data / f"tansu-{policy}.log") as bootstrap,
            _fleet(options, data, model_dir, vllm, policy) as inventory,
        ):
            _note(f"policy {policy}: {options.duration_s:.0f} s of load, {options.users} users")
            load = (options.duration_s, options.users, options.seed)
            runs[policy] = asyncio.run(run_policy(bootstrap, inventory, data, store_url, policy, load))
        run = runs[policy].run_id
        if policy == RAN:  # every policy predicted from A's run, before the others run
            out = data / "replay-predicted.json"
            replays[policy] = replay(run, policies, options.seed, store_url, out, options.draws)
            export = export_run(run, store_url, data / "replay")
            nominal, placement = _nominal_and_placement(options, export, policies)
        else:  # the store's figures of this run (and its own replay, for the record)
            replays[policy] = replay(run, [policy], options.seed, store_url, data / f"replay-{policy}.json")
    observed = {p: r["observed"] for p, r in replays.items()}
    replay_of_a = replays[RAN]
    predicted = median_results(replay_of_a)
    errors = {
        p: {
            "calibrated": _errors(predicted[p], observed[p]),
            **({"nominal": _errors(nominal[p], observed[p])} if nominal is not None else {}),
        }
        for p in policies
    }
    document: dict[str, Any] = {
        "engines": options.engines,
        "profile": EMULATED_PROFILE if options.engines == "emulated" else "vllm",
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
        "policy_ran": RAN,
        "self_error": errors[RAN]["calibrated"],
        "counterfactual_error": errors[COUNTERFACTUAL]["calibrated"],
        "errors": errors,
        "targets": TARGETS[options.engines],
        "runs": {p: {"run_id": r.run_id, "client": r.client, "engines": r.engines} for p, r in runs.items()},
        "observed": observed,
        "predicted": predicted,
        "draws": replay_of_a.get("draws"),
        **({"predicted_nominal": nominal} if nominal is not None else {}),
        "placement": placement,
        "own_replay_error": {p: r["self_error"] for p, r in replays.items()},
        "calibration": replay_of_a["calibration"],
        "workload": replay_of_a["workload"],
    }
    document["met"] = targets_met(document)
    return document


def _errors(predicted: Mapping[str, Any], observed: Mapping[str, Any]) -> dict[str, float | None]:
    """Per ``ERROR_KEYS``: (predicted - observed) / observed, rounded to 4 decimals; None where
    either figure is missing or the observed one is 0 (``tokenfleet replay``'s ``self_error``)."""
    errors: dict[str, float | None] = {}
    for key, name in FIGURES.items():
        p, o = predicted.get(name), observed.get(name)
        numbers = isinstance(p, int | float) and isinstance(o, int | float)
        errors[key] = round((p - o) / o, 4) if numbers and o else None
    return errors


def targets_met(document: Mapping[str, Any]) -> dict[str, bool]:
    """Each target of ``TARGETS`` (for the document's engines) as met or not: |error| at most
    the target; a missing error (None) is not met."""

    def within(error: float | None, target: float) -> bool:
        return error is not None and abs(error) <= target

    met = {}
    if document["engines"] == "vllm":
        for kind, figures in TARGETS["vllm"].items():
            for key, target in figures.items():
                met[f"{kind}.{key}"] = within(document[kind][key], target)
    else:
        for policy, target in TARGETS["emulated"]["calibrated_goodput"].items():
            met[f"calibrated_goodput.{policy}"] = within(
                document["errors"][policy]["calibrated"]["goodput"], target
            )
    return met


@contextlib.contextmanager
def _vllm_servers(data: Path, model_dir: Path) -> Iterator[VllmServers]:
    python = engine_python_or_none()
    if python is None:
        from local.vllm_launcher import ENGINE_MISSING

        raise ValueError(ENGINE_MISSING)
    _note(f"starting {SERVERS} vLLM servers (CPU, {MODEL}); ~30-60 s")
    servers = VllmServers(
        server_specs(SERVERS),
        model_dir,
        data / "servers",
        served_model_name=MODEL,
        python=python,
        extra_env={"VLLM_SERVER_DEV_MODE": "1"},  # /reset_prefix_cache between policies
    )
    with servers:
        yield servers


@contextlib.contextmanager
def _fleet(
    options: BenchOptions, data: Path, model_dir: Path, vllm: VllmServers | None, policy: str
) -> Iterator[Path]:
    """The inventory file of a cold fleet for ``policy``'s run: the vLLM servers with their
    prefix caches reset, or emulated servers started for it (and stopped after it)."""
    inventory = data / f"inventory-{policy}.yaml"
    if vllm is not None:
        for spec in vllm.specs:
            reset = urllib.request.Request(vllm.url(spec.instance_id) + "/reset_prefix_cache", method="POST")
            with urllib.request.urlopen(reset, timeout=10):
                pass
        inventory.write_text(dump_inventory(vllm.inventory()))
        yield inventory
        return
    emulated = EmulatedServers(
        SERVERS, EMULATED_PROFILE, options.speed, MODEL, model_dir, data / f"emulated-{policy}"
    )
    with emulated:
        inventory.write_text(dump_inventory(emulated.inventory()))
        yield inventory


def tokenfleet(args: Sequence[str], store_url: str, log: Path | None = None) -> None:
    """``tokenfleet ARGS`` on the store at ``store_url``, as a user runs it (its own process: the
    embedded store admits one at a time); its output to ``log`` (None: this one's).
    ``RuntimeError`` if it fails."""
    env = {**os.environ, "TOKENFLEET_CLICKHOUSE_DSN": store_url}
    with contextlib.ExitStack() as files:
        out = None if log is None else files.enter_context(log.open("a"))
        done = subprocess.run([sys.executable, "-m", "cli.main", *args], env=env, stdout=out, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tokenfleet {' '.join(args)} exited {done.returncode}")


def replay(
    run: str, policies: Sequence[str], seed: int, store_url: str, out: Path, draws: int = 1
) -> dict[str, Any]:
    """``tokenfleet replay --run RUN --policy P ... --draws N --json OUT``'s document (the first
    replay prints its tables here, the others to ``OUT``'s ``.log``)."""
    log = None if out.name == "replay-predicted.json" else out.with_suffix(".log")
    flags = [arg for policy in policies for arg in ("--policy", policy)]
    args = ["replay", "--run", run, *flags, "--seed", str(seed), "--draws", str(draws), "--json", str(out)]
    tokenfleet(args, store_url, log)
    document: dict[str, Any] = json.loads(out.read_text())
    return document


def median_results(document: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A replay's ``results``, each figure it drew several times (``draws``) replaced by its
    median over the draws."""
    draws = document.get("draws")
    results: dict[str, dict[str, Any]] = document["results"]
    if draws is None:
        return results
    return {
        policy: {**result, **{n: s["median"] for n, s in draws["figures"][policy].items() if s is not None}}
        for policy, result in results.items()
    }


def export_run(run: str, store_url: str, directory: Path) -> Path:
    """``tokenfleet replay export`` and ``replay calibrate`` of run ``run`` into ``directory``
    (``workload.jsonl``, ``fleet.yaml``, ``profiles.yaml``)."""
    log = directory.with_suffix(".log")
    tokenfleet(["replay", "export", "--run", run, "--out", str(directory)], store_url, log)
    tokenfleet(
        ["replay", "calibrate", "--run", run, "--out", str(directory / "profiles.yaml")], store_url, log
    )
    return directory


def _nominal_and_placement(
    options: BenchOptions, export: Path, policies: Sequence[str]
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The nominal replay's results per policy (emulated engines; else None) and, per policy,
    where the calibrated replay put the requests (``placement``), from the export's files as
    ``tokenfleet simulate --fleet fleet.yaml --workload workload.jsonl --profiles profiles.yaml``
    reads them, on ``tokenfleet replay``'s simulator settings (``SimConfig``'s defaults)."""
    import yaml

    from sim.engine.fleet import fleet_from_doc
    from sim.engine.profiles import BUILT_IN, PROFILES, ProfileSet
    from sim.evaluation.compare import compare
    from sim.loop.config import SimConfig
    from sim.loop.runner import simulate

    workload, calibrated = calibrated_replay(export)
    config = SimConfig(seed=options.seed)
    placement = {p: placement_of(simulate(workload, calibrated, p, config).attempts) for p in policies}
    if options.engines != "emulated":
        return None, placement
    nominal_profile = slowed(PROFILES[NOMINAL_PROFILE], options.speed)
    doc = yaml.safe_load((export / "fleet.yaml").read_text())
    for dc in doc["data_centres"]:
        for group in dc["instances"]:
            group["profile"] = nominal_profile.name
    profiles = ProfileSet({**BUILT_IN.profiles, nominal_profile.name: nominal_profile}, BUILT_IN.models)
    fleet = fleet_from_doc(doc, export / "fleet.nominal.yaml", profiles)
    document, _ = compare(workload, fleet, policies, config)
    results = document["results"]
    assert isinstance(results, dict)
    return results, placement


def calibrated_replay(export: Path) -> tuple[Workload, FleetSpec]:
    """The exported workload and its fleet on the fitted profiles, as ``tokenfleet simulate
    --workload workload.jsonl --fleet fleet.yaml --profiles profiles.yaml`` reads them."""
    from sim.engine.fleet import parse_fleet
    from sim.engine.profiles import load_profiles
    from sim.workloads.trace import load_workload

    fleet = parse_fleet(str(export / "fleet.yaml"), load_profiles(export / "profiles.yaml"))
    return load_workload(export / "workload.jsonl"), fleet


def slowed(profile: EngineProfile, speed: float) -> EngineProfile:
    """``profile`` on a clock ``speed`` times slower than its own: every step-time term divided by
    ``speed``; capacity and price unchanged; named ``NAME@xSPEED``."""
    from dataclasses import replace

    from sim.engine.calibration import TERMS

    terms = {term: getattr(profile, term) / speed for term in TERMS}
    return replace(profile, name=f"{profile.name}@x{speed:g}", **terms)


def placement_of(attempts: Sequence[Attempt]) -> dict[str, dict[str, float]]:
    """Per instance, its share of the sent attempts and the share of their prompt tokens it found
    cached (``cached_tokens`` / ``input_tokens``)."""
    by_instance: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        if attempt.instance is not None:
            by_instance.setdefault(attempt.instance.spec.instance_id, []).append(attempt)
    sent = sum(len(mine) for mine in by_instance.values())
    out = {}
    for name, mine in sorted(by_instance.items()):
        prompt = sum(a.request.input_tokens for a in mine)
        out[name] = {
            "request_share": round(len(mine) / sent, 4),
            "cached_share": round(sum(a.cached_tokens for a in mine) / prompt, 4) if prompt else 0.0,
        }
    return out


# -- what it prints ---------------------------------------------------------------------------


def report_lines(document: Mapping[str, Any]) -> list[str]:
    """Per policy and figure: observed, predicted (calibrated), error, and (emulated) the nominal
    prediction and its error; the real runs' clients and engines beside the replay's placement;
    then each target with the error it bounds."""
    nominal = document.get("predicted_nominal")
    head = ["policy", "figure", "observed", "predicted", "error"] + (["nominal", "error"] if nominal else [])
    rows = [head]
    for policy, errors in document["errors"].items():
        for rank, key in enumerate(ERROR_KEYS):
            name = FIGURES[key]
            row = [
                policy if rank == 0 else "",
                key,
                _num(document["observed"][policy].get(name)),
                _num(document["predicted"][policy].get(name)),
                _pct(errors["calibrated"][key]),
            ]
            if nominal:
                row += [_num(nominal[policy].get(name)), _pct(errors["nominal"][key])]
            rows.append(row)
    lines = [
        "",
        f"bench.replay on {document['engines']} engines ({document['profile']}): predicted from "
        f"the {document['policy_ran']} run, observed in each policy's own run",
        *_aligned(rows),
    ]
    lines.append("")
    for policy, run in document["runs"].items():
        client = run["client"]
        real = ", ".join(
            f"{k} {v['hit_rate']:.0%} ({v['preemptions']} pre-emptions)" for k, v in run["engines"].items()
        )
        replayed = ", ".join(
            f"{k} {v['request_share']:.0%} of requests, {v['cached_share']:.0%} cached"
            for k, v in document["placement"].get(policy, {}).items()
        )
        lines.append(
            f"{policy}: {client['ok']} answered, {client['failed']} failed, client TTFT p50 "
            f"{client['ttft_p50_s']} s; engines' prefix hits {real}; replay: {replayed}"
        )
    lines.append("")
    for kind, figures in document["targets"].items():
        for key, target in figures.items():
            error = (
                document["errors"][key]["calibrated"]["goodput"]
                if kind == "calibrated_goodput"
                else document[kind][key]
            )
            met = document["met"][f"{kind}.{key}"]
            lines.append(
                f"target {kind} {key}: |{_pct(error)}| <= {target:.0%}: {'met' if met else 'MISSED'}"
            )
    return lines


def _num(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.3f}"


def _pct(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:+.1%}"


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]


def _note(text: str) -> None:
    print(f"bench.replay: {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.splitlines()[0])
    parser.add_argument("--engines", choices=("vllm", "emulated"), default="vllm")
    parser.add_argument(
        "--duration", type=float, default=60.0, metavar="S", help="seconds of load per policy"
    )
    parser.add_argument("--users", type=int, default=8, metavar="N", help="concurrent users (openai clients)")
    parser.add_argument("--speed", type=float, default=0.2, metavar="X", help="emulated engines' speed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--draws",
        type=int,
        default=5,
        metavar="N",
        help="replays of the first run; the prediction is their median",
    )
    parser.add_argument(
        "--shared-broker", action="store_true", help="one broker for every run, as make demo-vllm"
    )
    parser.add_argument("--data", type=Path, default=None, metavar="DIR", help="keep the store and logs here")
    parser.add_argument("--json", type=str, default=None, metavar="J")
    args = parser.parse_args(argv)
    if args.draws < 1:
        parser.error(f"--draws must be at least 1, not {args.draws}")
    options = BenchOptions(
        args.engines,
        args.duration,
        args.users,
        args.seed,
        args.speed,
        args.data,
        args.shared_broker,
        args.draws,
    )
    started = time.monotonic()
    document = run_bench(options)
    document["wall_s"] = round(time.monotonic() - started, 1)
    print("\n".join(report_lines(document)))
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
