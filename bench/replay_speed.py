"""The replay's speed: export and calibrate of a one-hour run, and a replay beside ``simulate``,
with and without the profiles ``calibrate`` wrote.

``python -m bench.replay_speed [--requests 100000] [--duration-s 3600] [--instances 16]
[--seed 0] [--store DIR] [--json J]``

1. Setup (timed apart, not part of the target). The run is a real simulator run, not random
   rows: the synthetic mix (``sim/workloads/synthetic.py``, seeded by ``--seed``; without its
   long documents, ``SHARE_DOC_QA``) drawn at ``OVERDRAW`` times the rate ``--requests`` /
   ``--duration-s`` (faster if that holds too few), its first ``--requests`` requests kept and
   their arrivals stretched over ``--duration-s``, served under ``round-robin`` by
   ``--instances`` instances of one model whose engines follow the perturbed law
   (``llama3-8b-h100-perturbed``: attention growth, step-time noise) and whose heartbeats name
   the profile ``vllm``, as a real engine's do (no built-in profile: the calibration starts from
   a rescaled prior, as it does on real engines). Every attempt of that run is then written into
   a fresh embedded store through the feedback sink, with a run id, as the worker and the
   dispatcher would have published it (``lab/simulated_store.py``: the request with its
   prompt's block-hash chain, its admission and routing decisions, its completion, and a
   heartbeat a second per instance). The write is timed (``store write``).
2. Timed, each as the user runs it: ``tokenfleet`` in its own process (``python -m cli.main``,
   its start-up included; the embedded store admits one process at a time), on the store:
   ``replay export --run RUN --out DIR``, ``replay calibrate --run RUN --out
   DIR/profiles.yaml``, then ``simulate --workload DIR/workload.jsonl --fleet DIR/fleet.yaml
   --profiles DIR/profiles.yaml --policy round-robin`` (the exported workload on the calibrated
   fleet), ``replay --run RUN --policy round-robin`` (the policy that ran: one simulation, after
   reading and calibrating the run itself) and ``replay --run RUN --profiles DIR/profiles.yaml
   --policy round-robin`` (the same, on the profiles calibrate wrote: the run read, not fitted
   again). The start-up every command pays (``tokenfleet --help``: the interpreter and the
   command line) is timed too, for reference.

Target (issue 51): export + calibrate under ``TARGET_S`` seconds at 100 000 requests in an
hour; the replay as fast as ``simulate`` (``replay_over_simulate`` near 1; with the profiles
given, ``replay_with_profiles_over_simulate``).

Prints the table to stdout, progress to stderr; ``--json`` writes ``requests`` (written to the
store), ``exported_requests`` (records of the exported workload), ``export_s``,
``calibrate_s``, ``export_calibrate_s``, ``simulate_s``, ``replay_s``,
``replay_over_simulate``, ``replay_with_profiles_s``, ``replay_with_profiles_over_simulate``,
``target_met``, ``same_result`` (both replays predicted what ``simulate`` did) and the setup's
and start-up's times.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from infra.clickhouse import connect, migrate
from lab.simulated_store import store_run
from sim.engine.fleet import FleetSpec, InstanceSpec
from sim.engine.profiles import PROFILES
from sim.loop.config import SimConfig
from sim.loop.runner import simulate
from sim.workloads.synthetic import SyntheticMix
from sim.workloads.trace import Workload, load_records

PROG = "python -m bench.replay_speed"
TARGET_S = 60.0
"""The bound on export + calibrate the benchmark checks (seconds)."""
RUN = "replay-speed"
POLICY = "round-robin"
MODEL = "llama3-8b"
DC = "dc-a"
ENGINE = replace(PROFILES["llama3-8b-h100-perturbed"], name="vllm")
"""The stored run's engines: the perturbed law, named as a real engine's heartbeats name it."""
SHARE_DOC_QA = 0.0
"""The mix without its long-document questions: chat sessions, API calls and batch jobs, a load
the default ``--instances`` are meant to serve at the default rate within their objectives (a
run of queues and client time-outs would time the store's retries, not the replay)."""
OVERDRAW = 1.1
DRAWS = 4
"""The mix is drawn at this many times the rate asked, so that it holds ``--requests``; drawn
again, faster, up to ``DRAWS`` times in all if it does not."""


@dataclass(frozen=True)
class SpeedOptions:
    requests: int = 100_000
    duration_s: float = 3600.0
    instances: int = 16
    seed: int = 0
    store: Path | None = None
    """Where the store, the exported files and the commands' logs go (None: a temporary
    directory, removed)."""

    def check(self) -> None:
        """``ValueError`` (one line) for an option out of range."""
        if self.requests < 1:
            raise ValueError(f"--requests must be at least 1, got {self.requests}")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"--duration-s must be a finite number of seconds > 0, got {self.duration_s}")
        if self.instances < 1:
            raise ValueError(f"--instances must be at least 1, got {self.instances}")
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        if self.store is not None and self.store.exists() and any(self.store.iterdir()):
            raise ValueError(f"--store {self.store} is not empty: give a new or empty directory")


def run_bench(options: SpeedOptions) -> dict[str, Any]:
    """Steps 1 and 2 of the module docstring; the JSON document."""
    options.check()
    with contextlib.ExitStack() as stack:
        data = options.store or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-speed-")))
        data = data.resolve()
        data.mkdir(parents=True, exist_ok=True)
        return _run(options, data)
    raise AssertionError("unreachable")


def _run(options: SpeedOptions, data: Path) -> dict[str, Any]:
    store_url = f"chdb:///{data / 'clickhouse'}"
    out = data / "replay"
    started = time.perf_counter()
    workload = speed_workload(options)
    fleet = speed_fleet(options.instances)
    _note(f"simulating the run: {len(workload.requests)} requests on {options.instances} instances")
    result = simulate(workload, fleet, POLICY, SimConfig(seed=options.seed))
    setup_run_s = time.perf_counter() - started
    _note(f"writing the run into the store ({setup_run_s:.1f} s to simulate it)")
    started = time.perf_counter()
    with connect(store_url) as client:  # closed before the commands open the store
        migrate(client)
        written = store_run(
            client, result, fleet, RUN, origin=float(int(time.time()) - options.duration_s - 600)
        )
    store_write_s = time.perf_counter() - started
    _note(f"stored {written} requests in {store_write_s:.1f} s; timing the commands")

    startup_s = tokenfleet(["--help"], store_url, data / "startup.log")
    export_s = tokenfleet(
        ["replay", "export", "--run", RUN, "--out", str(out)], store_url, data / "export.log"
    )
    profiles = out / "profiles.yaml"
    calibrate_s = tokenfleet(
        ["replay", "calibrate", "--run", RUN, "--out", str(profiles)], store_url, data / "calibrate.log"
    )
    same = ["--policy", POLICY, "--seed", str(options.seed)]
    simulate_s = tokenfleet(
        ["simulate", "--workload", str(out / "workload.jsonl"), "--fleet", str(out / "fleet.yaml"),
         "--profiles", str(profiles), *same, "--quiet", "--json", str(data / "simulate.json")],
        store_url, data / "simulate.log",
    )  # fmt: skip
    replay_s = tokenfleet(
        ["replay", "--run", RUN, *same, "--json", str(data / "replay.json")], store_url, data / "replay.log"
    )
    replay_with_profiles_s = tokenfleet(
        ["replay", "--run", RUN, "--profiles", str(profiles), *same,
         "--json", str(data / "replay-profiles.json")],
        store_url, data / "replay-profiles.log",
    )  # fmt: skip
    with (out / "workload.jsonl").open() as lines:
        exported = sum(1 for _ in lines)
    export_calibrate_s = export_s + calibrate_s
    return {
        "requests": written,
        "exported_requests": exported,
        "duration_s": options.duration_s,
        "instances": options.instances,
        "seed": options.seed,
        "setup_run_s": round(setup_run_s, 2),
        "store_write_s": round(store_write_s, 2),
        "startup_s": round(startup_s, 2),
        "export_s": round(export_s, 2),
        "calibrate_s": round(calibrate_s, 2),
        "export_calibrate_s": round(export_calibrate_s, 2),
        "target_s": TARGET_S,
        "simulate_s": round(simulate_s, 2),
        "replay_s": round(replay_s, 2),
        "replay_over_simulate": round(replay_s / simulate_s, 3),
        "replay_with_profiles_s": round(replay_with_profiles_s, 2),
        "replay_with_profiles_over_simulate": round(replay_with_profiles_s / simulate_s, 3),
        "target_met": export_calibrate_s < TARGET_S,
        "same_result": _same_result(
            data / "simulate.json", data / "replay.json", data / "replay-profiles.json"
        ),
    }


def _same_result(simulated: Path, *replayed: Path) -> bool:
    """Whether each replay predicted what ``simulate`` of its export did (goodput and TTFT
    percentiles of ``POLICY``): they timed the same simulation."""
    sim = json.loads(simulated.read_text())["results"][POLICY]
    keys = ("goodput_tokens_per_s", "ttft_p50_s", "ttft_p95_s")
    for path in replayed:
        rep = json.loads(path.read_text())["results"][POLICY]
        if any(sim.get(k) != rep.get(k) for k in keys):
            return False
    return True


# -- the stored run ------------------------------------------------------------------------------


def speed_workload(options: SpeedOptions) -> Workload:
    """The synthetic mix's first ``options.requests`` requests over ``options.duration_s``
    (module docstring); ``ValueError`` if the draw holds fewer."""
    rate = options.requests / options.duration_s
    records: list[dict[str, Any]] = []
    for _ in range(DRAWS):  # the mix's rate is its sessions' and jobs', not exactly its requests'
        rate *= OVERDRAW * options.requests / max(len(records), options.requests)
        mix = SyntheticMix(options.duration_s, rate, options.seed, share_doc_qa=SHARE_DOC_QA)
        records = mix.generate()
        if len(records) >= options.requests:
            break
    else:
        raise ValueError(f"the mix drew {len(records)} requests, fewer than --requests {options.requests}")
    kept = records[: options.requests]
    last_ms = kept[-1]["timestamp"]
    stretch = options.duration_s * 1000 / last_ms if last_ms > 0 else 1.0
    for record in kept:
        record["timestamp"] = round(record["timestamp"] * stretch)
    return load_records(kept, f"synthetic x{options.requests}")


def speed_fleet(instances: int) -> FleetSpec:
    """``instances`` engines of ``MODEL`` in one data centre, on ``ENGINE``."""
    specs = tuple(InstanceSpec(f"{DC}/i{k:03d}", DC, MODEL, "1", ENGINE) for k in range(instances))
    return FleetSpec(f"{instances}x{ENGINE.name}", specs)


# -- the commands --------------------------------------------------------------------------------


def tokenfleet(args: Sequence[str], store_url: str, log: Path) -> float:
    """The wall time (s) of ``tokenfleet ARGS`` in its own process on the store at
    ``store_url``, its output appended to ``log``; ``RuntimeError`` if it fails."""
    env = {**os.environ, "TOKENFLEET_CLICKHOUSE_DSN": store_url}
    with log.open("a") as out:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "cli.main", *args], env=env, stdout=out, stderr=out, check=False
        )
        wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"tokenfleet {' '.join(args)} exited {done.returncode} (see {log})")
    _note(f"tokenfleet {' '.join(args[:2])}: {wall:.1f} s")
    return wall


# -- what it prints ------------------------------------------------------------------------------


def report_lines(document: dict[str, Any]) -> list[str]:
    """The table of the module docstring, and the start-up's time beneath it."""
    target = f"export+calibrate (target {document['target_s']:.0f} s)"
    met = "met" if document["target_met"] else "MISSED"
    rows = [
        ("store write (setup)", f"{document['store_write_s']:.1f} s", ""),
        ("export", f"{document['export_s']:.1f} s", ""),
        ("calibrate", f"{document['calibrate_s']:.1f} s", ""),
        (target, f"{document['export_calibrate_s']:.1f} s", met),
        ("simulate", f"{document['simulate_s']:.1f} s", ""),
        ("replay", f"{document['replay_s']:.1f} s", ""),
        ("replay/simulate", f"{document['replay_over_simulate']:.2f}", ""),
        ("replay --profiles", f"{document['replay_with_profiles_s']:.1f} s", ""),
        ("replay --profiles/simulate", f"{document['replay_with_profiles_over_simulate']:.2f}", ""),
    ]
    width = max(len(r[0]) for r in rows)
    value = max(len(r[1]) for r in rows)
    head = (
        f"bench.replay_speed: {document['requests']} requests over {document['duration_s']:.0f} s on "
        f"{document['instances']} instances (exported {document['exported_requests']}); each command "
        "in its own process"
    )
    lines = ["", head, *(f"  {n.ljust(width)}  {v.rjust(value)}  {m}".rstrip() for n, v, m in rows)]
    lines.append(
        f"  (tokenfleet --help, the start-up every command pays: {document['startup_s']:.1f} s; the run "
        f"simulated for the store in {document['setup_run_s']:.1f} s; the replays and simulate agree: "
        f"{'yes' if document['same_result'] else 'NO'})"
    )
    return lines


def _note(text: str) -> None:
    print(f"bench.replay_speed: {text}", file=sys.stderr, flush=True)


class _Parser(argparse.ArgumentParser):
    """argparse, its errors on one line (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000, metavar="N", help="requests in the run")
    parser.add_argument("--duration-s", type=float, default=3600.0, metavar="S", help="the run's length")
    parser.add_argument("--instances", type=int, default=16, metavar="N", help="engines that served it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--store", type=Path, default=None, metavar="DIR", help="keep the store, files, logs here"
    )
    parser.add_argument("--json", type=str, default=None, metavar="J")
    args = parser.parse_args(argv)
    options = SpeedOptions(args.requests, args.duration_s, args.instances, args.seed, args.store)
    try:
        options.check()
    except ValueError as exc:
        parser.error(str(exc))
    document = run_bench(options)
    print("\n".join(report_lines(document)))
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
        _note(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
