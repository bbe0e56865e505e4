"""A kubelet in miniature: runs the containers of rendered Kubernetes manifests as local
processes, so that tests exercise the manifests' exact commands, environment and probes.

What it does as Kubernetes would:

* the process is the image's ENTRYPOINT (read from the Dockerfile) + the container's ``args``
  (or its ``command``), with ``$(VAR)`` references expanded from the container's environment;
* the environment is built in Kubernetes' order: service links (unless
  ``enableServiceLinks: false``), ``envFrom`` ConfigMaps and Secrets (optional ones may be
  missing), then ``env`` with ``$(VAR)`` expansion, downward-API ``fieldRef`` values
  (``metadata.name``, ``metadata.namespace``, ``metadata.labels['k']``, ``status.podIP``,
  ``spec.nodeName``...) and ``HOSTNAME`` = the pod name;
* every pod gets its own IP (an address of 127.0.0.0/8, so that every pod can bind the
  manifest's ports), and cluster DNS is an ``/etc/hosts`` bind-mounted into the process's own
  mount namespace (as the kubelet manages a pod's /etc/hosts): Service names, headless pod
  names (``pod.service.namespace.svc[.cluster.local]``), short and long;
* volumes are directories: a volume claim is one per pod name that outlives the pod, a
  ConfigMap volume holds its files, a downward-API volume its ``annotations`` file (kept
  current when the pod is annotated), an emptyDir is fresh per pod;
* readiness is polled at the probe's path and port on the pod IP; deleting a pod sends SIGTERM
  and SIGKILL after ``terminationGracePeriodSeconds``.

What it cannot do, and does instead:

* no container file system: a path under a volume's ``mountPath`` in the environment or the
  arguments is rewritten to the volume's directory, and the image's files are this checkout
  (``pystreams`` from the test's virtual environment);
* PID 1 is not tini: the process after ``tini --`` is run directly (the image test covers tini);
* ``runAsUser``, ``readOnlyRootFilesystem`` and resource limits are not enforced (the image
  test runs the container with a read-only root file system where Docker exists).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pystreams.broker import _die_with_parent_hook  # pods die with the test, as brokers do

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_DOMAIN = "cluster.local"
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class KubeletUnavailable(RuntimeError):
    """This machine cannot give a process its own mount namespace (so no pod /etc/hosts)."""


def private_mounts_unavailable_reason() -> str | None:
    """None when ``unshare --mount`` can bind-mount a file over /etc/hosts here."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "no unshare(1) to give pods their own /etc/hosts"
    probe = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", "mount --bind /etc/hosts /etc/hosts"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if probe.returncode != 0:
        return f"cannot bind-mount a pod's /etc/hosts in a private mount namespace: {probe.stderr.strip()}"
    return None


def image_entrypoint(dockerfile: Path = ROOT / "Dockerfile") -> tuple[list[str], list[str]]:
    """(ENTRYPOINT, CMD) of the final stage, in exec form."""
    entrypoint: list[str] = []
    cmd: list[str] = []
    for line in dockerfile.read_text().splitlines():
        instruction, _, rest = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            entrypoint, cmd = [], []
        elif instruction.upper() == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif instruction.upper() == "CMD":
            cmd = json.loads(rest)
    return entrypoint, cmd


#: Variables a pod process takes from this machine, not from its manifest.
_HOST_ENV = frozenset({"PATH", "HOME", "LANG", "TMPDIR"})


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: unknown references stay as written, ``$$`` is ``$``."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR_REF.sub(replace, value)


def _field_value(path: str, pod: Pod) -> str:
    if path == "metadata.name":
        return pod.name
    if path == "metadata.namespace":
        return pod.namespace
    if path == "status.podIP":
        return pod.ip
    if path == "spec.nodeName":
        return pod.node
    if path == "metadata.uid":
        return pod.uid
    labels = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
    if labels:
        return pod.labels.get(labels.group(1), "")
    annotations = re.fullmatch(r"metadata\.annotations\['([^']+)'\]", path)
    if annotations:
        return pod.annotations.get(annotations.group(1), "")
    raise ValueError(f"downward API field {path!r} is not emulated")


def _annotations_file(annotations: Mapping[str, str]) -> str:
    # The kubelet's format: one key="value" per line, sorted, value quoted as a Go string.
    return "".join(f"{key}={json.dumps(value)}\n" for key, value in sorted(annotations.items()))


@dataclass
class Pod:
    name: str
    namespace: str
    ip: str
    node: str
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: dict[str, Any]
    owner: str  # the workload's name
    uid: str = field(default_factory=lambda: f"{random.getrandbits(64):016x}")
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    started_at: float = 0.0
    downward_files: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def container(self) -> dict[str, Any]:
        return self.spec["containers"][0]

    def port(self, name_or_number: str | int) -> int:
        if isinstance(name_or_number, int) or str(name_or_number).isdigit():
            return int(name_or_number)
        for port in self.container.get("ports", []):
            if port.get("name") == name_or_number:
                return int(port["containerPort"])
        raise KeyError(f"pod {self.name}: no container port named {name_or_number!r}")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def get(self, path: str, port: str | int, timeout_s: float = 2.0) -> tuple[int | None, str]:
        """(status, body) of GET http://POD_IP:PORT/PATH, or (None, error) when unreachable."""
        connection = http.client.HTTPConnection(self.ip, self.port(port), timeout=timeout_s)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode(errors="replace")
        except OSError as error:
            return None, str(error)
        finally:
            connection.close()

    def probe_ready(self) -> bool:
        """The readiness probe as the manifest writes it (httpGet or tcpSocket)."""
        probe = self.container.get("readinessProbe")
        if probe is None:
            return self.running()
        if not self.running():
            return False
        if "httpGet" in probe:
            status, _ = self.get(probe["httpGet"]["path"], probe["httpGet"]["port"], timeout_s=probe.get("timeoutSeconds", 1))
            return status is not None and 200 <= status < 400
        if "tcpSocket" in probe:
            import socket

            with socket.socket() as sock:
                sock.settimeout(1)
                return sock.connect_ex((self.ip, self.port(probe["tcpSocket"]["port"]))) == 0
        raise ValueError(f"pod {self.name}: readiness probe kind not emulated: {probe}")


class MiniKubelet:
    """Pods of one namespace on this machine. ``objects``: the rendered manifests."""

    def __init__(
        self, objects: Iterable[dict[str, Any]], workdir: Path, *, namespace: str = "pystreams-test", zones: Iterable[str] = ("zone-a", "zone-b")
    ) -> None:
        reason = private_mounts_unavailable_reason()
        if reason is not None:
            raise KubeletUnavailable(reason)
        self.objects = list(objects)
        self.namespace = namespace
        self.workdir = workdir
        self.zones = list(zones)
        self.pods: dict[str, Pod] = {}
        self.hosts_file = workdir / "hosts"
        self._net = f"127.{random.randint(64, 250)}.{random.randint(1, 250)}"
        self._next_ip = 1
        self._lock = threading.Lock()
        self.entrypoint, self.cmd = image_entrypoint()
        self._write_hosts()

    # -- objects ----------------------------------------------------------------------------

    def find(self, kind: str, name: str) -> dict[str, Any]:
        for obj in self.objects:
            if obj["kind"] == kind and obj["metadata"]["name"] == name:
                return obj
        raise KeyError(f"no {kind} {name} in the manifests")

    def config_map(self, name: str) -> dict[str, str]:
        return dict(self.find("ConfigMap", name).get("data", {}))

    def _secret(self, name: str) -> dict[str, str] | None:
        try:
            secret = self.find("Secret", name)
        except KeyError:
            return None
        import base64

        data = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
        return {**data, **secret.get("stringData", {})}

    def services(self) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] == "Service"]

    # -- DNS ----------------------------------------------------------------------------------

    def _write_hosts(self) -> None:
        """Rewritten in place (same inode) so that the bind mounts of running pods see it."""
        lines = ["127.0.0.1 localhost"]
        ns, domain = self.namespace, CLUSTER_DOMAIN
        for service in self.services():
            name = service["metadata"]["name"]
            backends = [pod for pod in self.pods.values() if self._selects(service, pod) and pod.running()]
            headless = service["spec"].get("clusterIP") == "None"
            for pod in backends:
                if not headless:
                    self._check_ports_pass_through(service, pod)
                names = [name, f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.{domain}"]
                if headless:
                    names += [f"{pod.name}.{name}.{ns}.svc", f"{pod.name}.{name}.{ns}.svc.{domain}", f"{pod.name}.{name}.{ns}", f"{pod.name}.{name}"]
                lines.append(f"{pod.ip} " + " ".join(names))
        for pod in self.pods.values():
            lines.append(f"{pod.ip} {pod.name}")
        text = "\n".join(lines) + "\n"
        if self.hosts_file.exists():
            with open(self.hosts_file, "r+") as handle:
                handle.seek(0)
                handle.write(text)
                handle.truncate()
        else:
            self.hosts_file.write_text(text)

    @staticmethod
    def _check_ports_pass_through(service: dict[str, Any], pod: Pod) -> None:
        # A ClusterIP is emulated by the backend's own address: only same-number ports work.
        for port in service["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            if pod.port(target) != int(port["port"]):
                raise ValueError(f"service {service['metadata']['name']}: port {port['port']} -> {target} remaps the port, which this emulation cannot do")

    def _selects(self, service: dict[str, Any], pod: Pod) -> bool:
        selector = service["spec"].get("selector") or {}
        return bool(selector) and all(pod.labels.get(k) == v for k, v in selector.items())

    # -- pods ---------------------------------------------------------------------------------

    def workload(self, name: str) -> dict[str, Any]:
        for kind in ("StatefulSet", "Deployment", "Job"):
            with contextlib.suppress(KeyError):
                return self.find(kind, name)
        raise KeyError(f"no workload {name}")

    def start_pod(self, workload: str, ordinal: int = 0, *, name: str | None = None) -> Pod:
        """Create (or recreate) the pod; its volume claims keep their directories."""
        spec_owner = self.workload(workload)
        template = spec_owner["spec"]["template"]
        pod_name = name or (f"{workload}-{ordinal}" if spec_owner["kind"] == "StatefulSet" else f"{workload}-{random.getrandbits(20):05x}")
        if pod_name in self.pods and self.pods[pod_name].running():
            raise RuntimeError(f"pod {pod_name} is running already")
        with self._lock:
            ip = f"{self._net}.{self._next_ip}"
            self._next_ip += 1
        zone = self.zones[ordinal % len(self.zones)]
        labels = dict(template["metadata"].get("labels", {}))
        labels.update(
            {
                "statefulset.kubernetes.io/pod-name": pod_name,
                # The StatefulSet controller's ordinal label (Kubernetes 1.28+).
                **({"apps.kubernetes.io/pod-index": str(ordinal)} if spec_owner["kind"] == "StatefulSet" else {}),
                # What the PodTopologyLabels admission copies from the node at binding.
                "topology.kubernetes.io/zone": zone,
            }
        )
        previous = self.pods.get(pod_name)
        pod = Pod(
            name=pod_name,
            namespace=self.namespace,
            ip=ip,
            node=f"node-{zone}-{ordinal}",
            labels=labels,
            annotations=dict(template["metadata"].get("annotations", {})),
            spec=template["spec"],
            owner=workload,
        )
        self.pods[pod_name] = pod
        command, env, cwd = self._process_of(pod, spec_owner)
        log_dir = self.workdir / "logs"
        log_dir.mkdir(exist_ok=True)
        incarnation = 0 if previous is None else len(list(log_dir.glob(f"{pod_name}.*.log")))
        pod.log_path = log_dir / f"{pod_name}.{incarnation}.log"
        wrapped = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(self.hosts_file), *command]
        with open(pod.log_path, "wb") as log:
            log.write(f"# {shlex.join(command)}\n".encode())
            log.flush()
            pod.process = subprocess.Popen(
                wrapped, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent_hook()
            )
        pod.started_at = time.monotonic()
        self._write_hosts()
        return pod

    def _process_of(self, pod: Pod, owner: dict[str, Any]) -> tuple[list[str], dict[str, str], str]:
        container = pod.container
        mounts = self._volumes(pod, owner)
        env: dict[str, str] = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""), "HOSTNAME": pod.name}
        for key in ("HOME", "LANG", "TMPDIR"):
            if key in os.environ:
                env[key] = os.environ[key]
        if pod.spec.get("enableServiceLinks", True):
            env.update(self._service_links())
        for source in container.get("envFrom", []):
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                ref = source["configMapRef"]
                try:
                    data = self.config_map(ref["name"])
                except KeyError:
                    if ref.get("optional"):
                        continue
                    raise
            else:
                ref = source["secretRef"]
                secret = self._secret(ref["name"])
                if secret is None:
                    if ref.get("optional"):
                        continue
                    raise KeyError(f"secret {ref['name']} is missing and not optional")
                data = secret
            env.update({prefix + k: v for k, v in data.items()})
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = expand(item["value"], env)
            elif "fieldRef" in item.get("valueFrom", {}):
                env[item["name"]] = _field_value(item["valueFrom"]["fieldRef"]["fieldPath"], pod)
            elif "configMapKeyRef" in item.get("valueFrom", {}):
                ref = item["valueFrom"]["configMapKeyRef"]
                env[item["name"]] = self.config_map(ref["name"])[ref["key"]]
            else:
                raise ValueError(f"env {item['name']}: source not emulated: {item}")
        entrypoint = container.get("command") or self.entrypoint
        arguments = container.get("args") if "args" in container else (self.cmd if "command" not in container else [])
        command = [expand(part, env) for part in [*entrypoint, *(arguments or [])]]
        if command[:2] == ["/usr/bin/tini", "--"]:
            command = command[2:]
        command = [self._local_path(part, mounts) for part in command]
        # The manifest's values name paths inside the pod; the host's own (PATH to this venv,
        # HOME...) must not be remapped, or a checkout under a mount path (/tmp) loses its venv.
        env = {key: value if key in _HOST_ENV else self._local_path(value, mounts) for key, value in env.items()}
        scratch = self.workdir / "pods" / pod.name
        scratch.mkdir(parents=True, exist_ok=True)
        return command, env, str(scratch)

    @staticmethod
    def _local_path(value: str, mounts: Mapping[str, Path]) -> str:
        for mount_path, local in sorted(mounts.items(), key=lambda item: -len(item[0])):
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(local) + value[len(mount_path) :]
        return value

    def _volumes(self, pod: Pod, owner: dict[str, Any]) -> dict[str, Path]:
        claims = {c["metadata"]["name"] for c in owner["spec"].get("volumeClaimTemplates", [])}
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        mounts: dict[str, Path] = {}
        for mount in pod.container.get("volumeMounts", []):
            name = mount["name"]
            if name in claims:
                local = self.workdir / "pvc" / f"{name}-{pod.name}"  # outlives the pod, as a PVC does
                local.mkdir(parents=True, exist_ok=True)
            else:
                local = self.workdir / "pods" / pod.name / "volumes" / name
                if local.exists():
                    shutil.rmtree(local)  # emptyDir and projected volumes are fresh per pod
                local.mkdir(parents=True)
                volume = volumes[name]
                if "configMap" in volume:
                    for key, text in self.config_map(volume["configMap"]["name"]).items():
                        (local / key).write_text(text)
                elif "downwardAPI" in volume:
                    for item in volume["downwardAPI"]["items"]:
                        path = item["fieldRef"]["fieldPath"]
                        if path == "metadata.annotations":
                            pod.downward_files.append((local / item["path"], path))
                            (local / item["path"]).write_text(_annotations_file(pod.annotations))
                        else:
                            (local / item["path"]).write_text(_field_value(path, pod))
                elif "emptyDir" not in volume:
                    raise ValueError(f"volume {name}: kind not emulated: {volume}")
            mounts[mount["mountPath"]] = local
        return mounts

    def _service_links(self) -> dict[str, str]:
        """The variables Kubernetes injects for every Service when service links are on."""
        links: dict[str, str] = {}
        for service in self.services():
            if service["spec"].get("clusterIP") == "None":
                continue
            prefix = service["metadata"]["name"].upper().replace("-", "_")
            ports = service["spec"].get("ports", [])
            host = "10.96.0.10"
            links[f"{prefix}_SERVICE_HOST"] = host
            if ports:
                links[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
                links[f"{prefix}_PORT"] = f"tcp://{host}:{ports[0]['port']}"
            for port in ports:
                number = port["port"]
                links[f"{prefix}_PORT_{number}_TCP"] = f"tcp://{host}:{number}"
        return links

    def annotate(self, pod_name: str, key: str, value: str) -> None:
        """``kubectl annotate pod``: the downward-API annotations file follows."""
        pod = self.pods[pod_name]
        pod.annotations[key] = value
        for path, _ in pod.downward_files:
            path.write_text(_annotations_file(pod.annotations))

    def delete_pod(self, pod_name: str) -> tuple[int, float]:
        """``kubectl delete pod``: SIGTERM, then SIGKILL after the grace period. Returns (exit
        status, seconds it took to stop)."""
        return self.delete_pods([pod_name])[pod_name]

    def delete_pods(self, pod_names: Iterable[str]) -> dict[str, tuple[int, float]]:
        """Several pods at once (a StatefulSet with Parallel pod management scaling in)."""
        pods = [self.pods[name] for name in pod_names]
        started = time.monotonic()
        for pod in pods:
            assert pod.process is not None
            if pod.process.poll() is None:
                pod.process.send_signal(signal.SIGTERM)
        results = {}
        for pod in pods:
            assert pod.process is not None
            grace = pod.spec.get("terminationGracePeriodSeconds", 30)
            try:
                pod.process.wait(max(0.0, started + grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                pod.process.kill()  # the kubelet's SIGKILL at the end of the grace period
                pod.process.wait()
            results[pod.name] = (pod.process.returncode, time.monotonic() - started)
        self._write_hosts()
        return results

    def wait_ready(self, pod_names: Iterable[str], timeout_s: float, *, what: str = "") -> float:
        """Poll the readiness probes until every pod is ready; seconds waited."""
        names = list(pod_names)
        started = time.monotonic()
        while True:
            not_ready = [name for name in names if not self.pods[name].probe_ready()]
            if not not_ready:
                return time.monotonic() - started
            dead = [name for name in not_ready if not self.pods[name].running()]
            if dead or time.monotonic() - started > timeout_s:
                tails = "\n".join(f"--- {n} ---\n" + "\n".join(self.pods[n].log().splitlines()[-30:]) for n in not_ready)
                raise AssertionError(f"{what or 'pods'}: not ready ({'exited: ' + ', '.join(dead) if dead else 'timeout'}): {not_ready}\n{tails}")
            time.sleep(0.1)

    def addresses(self) -> dict[str, str]:
        """Host name -> IP, as the pods' /etc/hosts has it now."""
        table: dict[str, str] = {}
        for line in self.hosts_file.read_text().splitlines():
            ip, *names = line.split()
            for name in names:
                table.setdefault(name, ip)
        return table

    @contextlib.contextmanager
    def cluster_dns(self) -> Iterator[None]:
        """Let this (test) process resolve the cluster's names too, as ``kubectl exec`` into a
        pod would: socket.getaddrinfo consults the pods' hosts table first."""
        import socket

        original = socket.getaddrinfo

        def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
            ip = self.addresses().get(host) if isinstance(host, str) else None
            return original(ip or host, *args, **kwargs)

        socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]
        try:
            yield
        finally:
            socket.getaddrinfo = original  # type: ignore[assignment]

    def stop_all(self) -> None:
        for pod in self.pods.values():
            if pod.running():
                assert pod.process is not None
                pod.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for pod in self.pods.values():
            if pod.process is None:
                continue
            try:
                pod.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pod.process.kill()
                pod.process.wait()


class ReadinessRecorder:
    """Samples the readiness probes of a set of pods in the background: how many were ready
    at the worst moment, and every sample (time, ready pod names)."""

    def __init__(self, kubelet: MiniKubelet, pods: Callable[[], Iterable[str]], interval_s: float = 0.1) -> None:
        self._kubelet = kubelet
        self._pods = pods
        self._interval_s = interval_s
        self.samples: list[tuple[float, frozenset[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="readiness", daemon=True)

    def __enter__(self) -> ReadinessRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            names = list(self._pods())
            ready = frozenset(n for n in names if n in self._kubelet.pods and self._kubelet.pods[n].probe_ready())
            self.samples.append((time.monotonic(), ready))
            self._stop.wait(self._interval_s)

    @property
    def fewest_ready(self) -> int:
        return min((len(ready) for _, ready in self.samples), default=0)


def render(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize DIR`` as objects."""
    import yaml

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise FileNotFoundError("kubectl")
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@contextlib.contextmanager
def running(kubelet: MiniKubelet) -> Iterator[MiniKubelet]:
    try:
        yield kubelet
    finally:
        kubelet.stop_all()
