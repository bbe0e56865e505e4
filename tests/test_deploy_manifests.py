"""deploy/: every overlay renders with kustomize, every object validates against the Kubernetes
OpenAPI schemas in strict mode (offline, kubernetes-validate), and a lint checks the settings
that make a fleet of static members work — and fails when one goes missing."""

from __future__ import annotations

import copy
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (test extra) is not installed")

from kubelet import render  # noqa: E402

from pystreams.worker.process import DEFAULT_COMMIT_INTERVAL_MS, LEAVE_TIMEOUT_S  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
#: The oldest Kubernetes the manifests promise to fit, and the newest the validator knows.
KUBERNETES_VERSIONS = ["1.32", kubernetes_validate.latest_version()]
TARGETS = {"base": DEPLOY / "base", "dev": DEPLOY / "overlays" / "dev", "prod": DEPLOY / "overlays" / "prod"}
#: Custom resources the validator has no schema for, with the API group they must use.
CUSTOM_KINDS = {"ServiceMonitor": "monitoring.coreos.com/v1", "ScaledObject": "keda.sh/v1alpha1"}
WORKER, COORDINATOR = "pystreams-worker", "pystreams-coordinator"


@pytest.fixture(scope="module", autouse=True)
def _needs_kubectl() -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: kustomize cannot render the manifests")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(path) for name, path in TARGETS.items()}


def _with_components(tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    """The base with optional components, rendered through a throw-away kustomization."""

    def relative(path: Path) -> str:  # kustomize takes no absolute paths
        return os.path.relpath(path, tmp_path)

    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {relative(DEPLOY / 'base')}\ncomponents:\n" + "".join(f"  - {relative(DEPLOY / 'components' / c)}\n" for c in components)
    )
    return render(tmp_path)


def _find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def _config(objects: list[dict[str, Any]], prefix: str) -> dict[str, str]:
    return next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(prefix))["data"]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container.get("env", [])}


# -- schema validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_strictly(rendered, target: str, version: str) -> None:
    objects = rendered[target]
    assert objects, f"{target} rendered nothing"
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            assert obj["apiVersion"] == CUSTOM_KINDS[obj["kind"]]
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{target}: {obj['kind']} {obj['metadata']['name']} is invalid for {version}: {error.message} at {list(error.path)}")


def test_strict_validation_catches_a_misspelt_field(rendered) -> None:
    worker = copy.deepcopy(_find(rendered["base"], "StatefulSet", WORKER))
    worker["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 60
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, KUBERNETES_VERSIONS[0], strict=True)


def test_components_render_and_point_at_the_base(tmp_path: Path) -> None:
    objects = _with_components(tmp_path, "servicemonitor", "autoscaling")
    worker_service = _find(objects, "Service", WORKER)
    monitor = _find(objects, "ServiceMonitor", WORKER)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= worker_service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in worker_service["spec"]["ports"]}
    coordinator_monitor = _find(objects, "ServiceMonitor", COORDINATOR)
    coordinator_service = _find(objects, "Service", COORDINATOR)
    assert coordinator_monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in coordinator_service["spec"]["ports"]}
    scaled = _find(objects, "ScaledObject", WORKER)
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("StatefulSet", WORKER)
    assert "pystreams_task_lag_records" in scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert scaled["spec"]["minReplicaCount"] >= 1 + int(_config(render(TARGETS["prod"]), "pystreams-worker-config")["PYSTREAMS_NUM_STANDBY_REPLICAS"])


# -- the lint ----------------------------------------------------------------------------------------


def _env_names_read_by(module: str) -> set[str]:
    """Every PYSTREAMS_* variable a command module mentions (so reads)."""
    source = (ROOT / "pystreams" / "commands" / f"{module}.py").read_text()
    return set(re.findall(r"PYSTREAMS_[A-Z_]+", source))


def lint(objects: list[dict[str, Any]]) -> list[str]:
    """What is wrong with a rendered fleet; empty when nothing is."""
    problems: list[str] = []
    worker = _find(objects, "StatefulSet", WORKER)
    spec = worker["spec"]
    pod = spec["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "worker")
    env = _env(container)
    config = {**_config(objects, "pystreams-worker-config"), **_config(objects, "pystreams-kafka")}
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}

    # Identity: the pod name as the static instance id, through the downward API.
    if env.get("POD_NAME") != {"fieldRef": {"fieldPath": "metadata.name"}}:
        problems.append("worker: POD_NAME is not the downward API's metadata.name")
    if env.get("PYSTREAMS_INSTANCE_ID") != "$(POD_NAME)":
        problems.append("worker: PYSTREAMS_INSTANCE_ID is not the pod name")
    if spec.get("podManagementPolicy") != "Parallel":
        problems.append("worker: podManagementPolicy is not Parallel")
    # State on a volume claim, mounted where the worker keeps its state.
    claims = {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    state_dir = env.get("PYSTREAMS_STATE_DIR", config.get("PYSTREAMS_STATE_DIR"))
    if not any(mounts.get(claim) == state_dir for claim in claims):
        problems.append("worker: no volume claim mounted at PYSTREAMS_STATE_DIR")
    # The user endpoint is the pod's DNS name under a headless Service.
    service = next((o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == spec["serviceName"]), None)
    if service is None or service["spec"].get("clusterIP") != "None":
        problems.append("worker: serviceName is not a headless Service")
    elif not str(env.get("PYSTREAMS_USER_ENDPOINT", "")).startswith(f"$(POD_NAME).{spec['serviceName']}."):
        problems.append("worker: the user endpoint is not the pod's stable DNS name")
    # Probes: readiness = restored and running, liveness = threads alive, on the HTTP port.
    http_port = env.get("PYSTREAMS_HTTP_PORT")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container.get(probe, {}).get("httpGet", {})
        port = ports.get(get.get("port"), get.get("port"))
        if get.get("path") != path or str(port) != str(http_port):
            problems.append(f"worker: {probe} is not GET {path} on PYSTREAMS_HTTP_PORT")
    # Long enough to commit and leave.
    commit_s = int(config.get("PYSTREAMS_COMMIT_INTERVAL_MS", DEFAULT_COMMIT_INTERVAL_MS)) / 1000
    if pod.get("terminationGracePeriodSeconds", 30) <= LEAVE_TIMEOUT_S + commit_s:
        problems.append(f"worker: terminationGracePeriodSeconds is not longer than a commit plus a leave ({commit_s + LEAVE_TIMEOUT_S:g} s)")
    # A pod that starts before its coordinator waits for it rather than exiting into CrashLoopBackOff.
    if str(config.get("PYSTREAMS_COORDINATOR_CONNECT_TIMEOUT_MS", env.get("PYSTREAMS_COORDINATOR_CONNECT_TIMEOUT_MS"))) != "0":
        problems.append("worker: gives up on a coordinator it never reached (PYSTREAMS_COORDINATOR_CONNECT_TIMEOUT_MS is not 0)")
    # Zones: the node's zone as a client tag, standbys spread by it, pods spread over zones.
    zone = env.get("ZONE")
    if zone != {"fieldRef": {"fieldPath": "metadata.labels['topology.kubernetes.io/zone']"}}:
        problems.append("worker: ZONE is not the pod's topology.kubernetes.io/zone label")
    if "zone=$(ZONE)" not in str(env.get("PYSTREAMS_CLIENT_TAGS", "")):
        problems.append("worker: the zone is not a client tag")
    if "zone" not in config.get("PYSTREAMS_RACK_AWARE_ASSIGNMENT_TAGS", "").split(","):
        problems.append("worker: standbys are not spread by zone (rack.aware.assignment.tags)")
    if not any(c.get("topologyKey") == "topology.kubernetes.io/zone" for c in pod.get("topologySpreadConstraints", [])):
        problems.append("worker: pods are not spread across zones")
    # A PDB that lets one worker go at a time.
    budgets = [
        o for o in objects if o["kind"] == "PodDisruptionBudget" and o["spec"]["selector"]["matchLabels"].items() <= spec["selector"]["matchLabels"].items()
    ]
    if [b["spec"].get("maxUnavailable") for b in budgets] != [1]:
        problems.append("worker: no PodDisruptionBudget with maxUnavailable: 1")
    # Settings the commands actually read (a misspelt variable is silently ignored otherwise).
    known = _env_names_read_by("worker")
    for name in [*config, *(k for k in env if k.startswith("PYSTREAMS_"))]:
        if name not in known:
            problems.append(f"worker: {name} is not a setting of pystreams worker")
    coordinator = _find(objects, "StatefulSet", COORDINATOR)
    known = _env_names_read_by("coordinator")
    for name in [*_config(objects, "pystreams-coordinator-config"), *_env(coordinator["spec"]["template"]["spec"]["containers"][0])]:
        if name.startswith("PYSTREAMS_") and name not in known:
            problems.append(f"coordinator: {name} is not a setting of pystreams coordinator")
    problems += _lint_pods(objects)
    return problems


def _lint_pods(objects: list[dict[str, Any]]) -> list[str]:
    """Every workload: hardened, sized, and without service links."""
    problems = []
    for obj in objects:
        if obj["kind"] not in ("StatefulSet", "Deployment", "Job"):
            continue
        name = f"{obj['kind']} {obj['metadata']['name']}"
        pod = obj["spec"]["template"]["spec"]
        if pod.get("enableServiceLinks") is not False:
            problems.append(f"{name}: service links inject variables named like settings")
        if pod.get("securityContext", {}).get("runAsNonRoot") is not True:
            problems.append(f"{name}: the pod may run as root")
        for container in pod["containers"]:
            security = container.get("securityContext", {})
            expected = {
                "runAsNonRoot": True,
                "readOnlyRootFilesystem": True,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            }
            for key, value in expected.items():
                if security.get(key) != value:
                    problems.append(f"{name}: container {container['name']} securityContext.{key} is not {value}")
            resources = container.get("resources", {})
            for kind in ("requests", "limits"):
                if not {"cpu", "memory"} <= set(resources.get(kind, {})):
                    problems.append(f"{name}: container {container['name']} has no cpu and memory {kind}")
            if "command" in container:
                problems.append(f"{name}: container {container['name']} replaces the entrypoint (tini)")
    return problems


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_lint_passes(rendered, target: str) -> None:
    assert lint(rendered[target]) == []


def _worker_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return _find(objects, "StatefulSet", WORKER)["spec"]["template"]["spec"]["containers"][0]


def _drop_env(name: str):
    def mutate(objects):
        container = _worker_container(objects)
        container["env"] = [e for e in container["env"] if e["name"] != name]

    return mutate


def _set(path: list[Any], value: Any):
    def mutate(objects):
        target = _find(objects, "StatefulSet", WORKER)
        for key in path[:-1]:
            target = target[key]
        if value is None:
            del target[path[-1]]
        else:
            target[path[-1]] = value

    return mutate


MUTATIONS = {
    "no volume claim": (_set(["spec", "volumeClaimTemplates"], None), "no volume claim mounted"),
    "no instance id": (_drop_env("PYSTREAMS_INSTANCE_ID"), "PYSTREAMS_INSTANCE_ID is not the pod name"),
    "instance id not from the downward API": (
        lambda o: next(e for e in _worker_container(o)["env"] if e["name"] == "POD_NAME").update({"valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}),
        "POD_NAME is not the downward API",
    ),
    "no readiness probe": (lambda o: _worker_container(o).pop("readinessProbe"), "readinessProbe is not GET /readyz"),
    "liveness on readiness": (lambda o: _worker_container(o)["livenessProbe"]["httpGet"].update({"path": "/readyz"}), "livenessProbe is not GET /healthz"),
    "short grace period": (_set(["spec", "template", "spec", "terminationGracePeriodSeconds"], 30), "terminationGracePeriodSeconds"),
    "no read-only root": (lambda o: _worker_container(o)["securityContext"].pop("readOnlyRootFilesystem"), "readOnlyRootFilesystem"),
    "capabilities kept": (lambda o: _worker_container(o)["securityContext"].update({"capabilities": {}}), "securityContext.capabilities"),
    "privilege escalation": (lambda o: _worker_container(o)["securityContext"].update({"allowPrivilegeEscalation": True}), "allowPrivilegeEscalation"),
    "service links": (_set(["spec", "template", "spec", "enableServiceLinks"], None), "service links"),
    "ordered pods": (_set(["spec", "podManagementPolicy"], "OrderedReady"), "podManagementPolicy"),
    "gives up on the coordinator": (
        lambda o: _config(o, "pystreams-worker-config").pop("PYSTREAMS_COORDINATOR_CONNECT_TIMEOUT_MS"),
        "PYSTREAMS_COORDINATOR_CONNECT_TIMEOUT_MS is not 0",
    ),
    "misspelt setting": (
        lambda o: _worker_container(o)["env"].append({"name": "PYSTREAMS_NUM_STANDBYS", "value": "1"}),
        "PYSTREAMS_NUM_STANDBYS is not a setting",
    ),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_lint_fails_when_a_setting_goes_missing(rendered, mutation: str) -> None:
    objects = copy.deepcopy(rendered["prod"])
    mutate, expected = MUTATIONS[mutation]
    mutate(objects)
    problems = lint(objects)
    assert any(expected in problem for problem in problems), problems


# -- what each overlay promises ------------------------------------------------------------------------


def test_coordinators_are_one_plain_replica_or_a_cluster_with_probes_and_metrics(rendered) -> None:
    for target in TARGETS:
        objects = rendered[target]
        coordinator = _find(objects, "StatefulSet", COORDINATOR)
        container = coordinator["spec"]["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        env = _env(container)
        budget = _find(objects, "PodDisruptionBudget", COORDINATOR)["spec"]
        if target == "prod":
            # Three nodes sharing the shards, each with its ordinal as node id; one may be down.
            assert coordinator["spec"]["replicas"] == 3 and env["PYSTREAMS_CLUSTER"] == "true"
            assert env["PYSTREAMS_NODE_ID"] == {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
            assert budget == {"minAvailable": 2, "selector": budget["selector"]}
            assert coordinator["spec"].get("podManagementPolicy", "OrderedReady") == "OrderedReady"  # one node at a time
        else:
            assert coordinator["spec"]["replicas"] == 1 and "PYSTREAMS_CLUSTER" not in env  # a plain one claims every shard
            assert budget["maxUnavailable"] == 1
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert str(ports[container["readinessProbe"]["httpGet"]["port"]]) == env["PYSTREAMS_METRICS_PORT"]
        for probe in ("livenessProbe", "startupProbe"):
            assert container[probe]["httpGet"]["path"] == "/healthz"
            assert str(ports[container[probe]["httpGet"]["port"]]) == env["PYSTREAMS_METRICS_PORT"]
        service = _find(objects, "Service", COORDINATOR)
        assert {p["name"] for p in service["spec"]["ports"]} == {"kafka", "metrics"}
        assert _config(objects, "pystreams-worker-config")["PYSTREAMS_COORDINATOR"] == f"{COORDINATOR}:{ports['kafka']}"


def test_dev_overlay_runs_the_broker_and_one_worker(rendered) -> None:
    objects = rendered["dev"]
    assert _find(objects, "StatefulSet", WORKER)["spec"]["replicas"] == 1
    assert _find(objects, "Deployment", "kafka")["spec"]["template"]["spec"]["containers"][0]["args"][0] == "broker"
    assert _find(objects, "Service", "kafka")
    job = _find(objects, "Job", "pystreams-topics")["spec"]["template"]["spec"]["containers"][0]
    assert job["args"][:2] == ["topics", "--create"]
    assert _config(objects, "pystreams-kafka")["PYSTREAMS_BOOTSTRAP_SERVERS"] == "kafka:9092"


def test_prod_overlay_has_three_workers_a_standby_warmups_and_anti_affinity(rendered) -> None:
    objects = rendered["prod"]
    worker = _find(objects, "StatefulSet", WORKER)
    assert worker["spec"]["replicas"] == 3
    config = _config(objects, "pystreams-worker-config")
    assert int(config["PYSTREAMS_NUM_STANDBY_REPLICAS"]) == 1
    assert int(config["PYSTREAMS_MAX_WARMUP_REPLICAS"]) >= 1
    anti = worker["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert _config(objects, "pystreams-kafka")["PYSTREAMS_BOOTSTRAP_SERVERS"] != "kafka:9092"  # an external cluster
    assert not any(o["kind"] == "Deployment" for o in objects)  # no embedded broker
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceMonitor"} == {WORKER, COORDINATOR}


def test_grafana_dashboard_queries_metrics_the_worker_and_coordinator_export() -> None:
    import json

    dashboard = json.loads((DEPLOY / "grafana" / "pystreams.json").read_text())
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert expressions
    names = set(re.findall(r"\b(pystreams_[a-z_]+|kafka_server_group_coordinator_metrics_[a-z_]+)", " ".join(expressions)))
    worker_metrics = (ROOT / "pystreams" / "worker" / "metrics.py").read_text()
    coordinator_metrics = " ".join(p.read_text() for p in (ROOT / "pystreams" / "coordinator").glob("*.py"))
    for name in names:
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        if name.startswith("pystreams_"):
            assert base.removeprefix("pystreams_") in worker_metrics, f"the dashboard queries {name}, which no worker exports"
        else:
            suffix = base.removeprefix("kafka_server_group_coordinator_metrics_")
            assert re.search(rf"\b{suffix}\b", coordinator_metrics), f"the dashboard queries {name}, which the coordinator does not export"
