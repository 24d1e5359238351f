"""The Helm chart, rendered with `helm template` (no cluster): lint, restricted-PSS security context,
probes on kopf's liveness endpoint, least-privilege RBAC with a reason per rule, names within 63 chars,
the values schema, the dashboard and the CRD copy."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from rtj.api import crdgen
from rtj.settings import Settings
from rtj_local.versions import bin_path

pytestmark = pytest.mark.unit

CHART = crdgen.REPO_ROOT / "charts" / "resilient-training-operator"
HELM = str(bin_path("helm"))
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
METRICS = (
    "rtj_jobs",
    "rtj_restarts_total",
    "rtj_recovery_seconds_bucket",
    "rtj_recovery_seconds_sum",
    "rtj_steps_lost_total",
    "rtj_heartbeat_age_seconds",
    "rtj_reconcile_duration_seconds_bucket",
    "rtj_heartbeat_delivery_seconds_bucket",
    "rtj_goodput_ratio",
)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HELM, *args], capture_output=True, text=True, check=check, timeout=60)


def render(*set_args: str, values: Path | None = None, release: str = "rtj") -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", "rtj-system"]
    if values:
        args += ["-f", str(values)]
    for s in set_args:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    (doc,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    return doc


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda p: p.name if p else "defaults")
def test_helm_lint_passes(values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    result = helm(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_deployment_meets_the_restricted_pod_security_standard() -> None:
    dep = one(render(), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert all("hostPath" not in v for v in pod["volumes"])
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc.get("privileged") is not True
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/tmp"}  # the only writable path
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


def test_two_replicas_one_elected_on_a_lease_spread_over_nodes_one_evicted_at_a_time() -> None:
    docs = render()
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "rtj"]  # the election runs before kopf (rtj.__main__)
    assert "--standalone" in c["args"] and "--all-namespaces" in c["args"] and "rtj.handlers" not in c["args"]
    env = env_of(dep)
    assert env["RTJ_LEADER_ELECTION_LEASE"] == "rtj-resilient-training-operator"
    assert env["RTJ_LEADER_ELECTION_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["RTJ_LEADER_ELECTION_IDENTITY"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    timing = {
        k: env[f"RTJ_LEADER_ELECTION_{k}"]
        for k in ("LEASE_SECONDS", "RENEW_DEADLINE_SECONDS", "RETRY_SECONDS")
    }
    settings = Settings.from_env({f"RTJ_LEADER_ELECTION_{k}": v for k, v in timing.items()})
    assert settings.leader_election_renew_deadline_seconds < settings.leader_election_lease_seconds
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": dep["spec"]["selector"]}
    # The Lease's RBAC: in the release namespace only, create (no name possible) and get/update by name.
    role = one(docs, "Role", "-leader")
    assert role["metadata"]["namespace"] == "rtj-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": ["rtj-resilient-training-operator"], "verbs": ["get", "update"]},
    ]  # fmt: skip
    binding = one(docs, "RoleBinding", "-leader")
    assert (
        binding["metadata"]["namespace"] == "rtj-system"
        and binding["roleRef"]["name"] == role["metadata"]["name"]
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "rtj-system"}
    ]


def test_without_leader_election_one_kopf_standalone_replica_with_recreate() -> None:
    docs = render("operator.leaderElection.enabled=false", "operator.replicas=1")
    dep = one(docs, "Deployment")
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert "command" not in c and c["args"][-2:] == ["-m", "rtj.handlers"] and "--standalone" in c["args"]
    assert not any(k.startswith("RTJ_LEADER_ELECTION") for k in env_of(dep))
    assert "affinity" not in dep["spec"]["template"]["spec"]
    assert not by_kind(docs, "PodDisruptionBudget") and not [
        d for d in by_kind(docs, "Role") if d["metadata"]["name"].endswith("-leader")
    ]
    rejected = helm(
        "template", "rtj", str(CHART), "--set", "operator.leaderElection.enabled=false", check=False
    )
    assert rejected.returncode != 0 and "leaderElection" in rejected.stderr  # 2 replicas, no election


def test_an_affinity_of_the_user_replaces_the_default_anti_affinity() -> None:
    term = {"matchExpressions": [{"key": "role", "operator": "In", "values": ["system"]}]}
    node_affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    }
    path = (
        "operator.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
    )
    expr = f"{path}.matchExpressions[0]"
    docs = render(f"{expr}.key=role", f"{expr}.operator=In", f"{expr}.values[0]=system")
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["affinity"] == node_affinity


def test_probes_use_kopf_liveness_endpoint() -> None:
    dep = one(render("operator.healthPort=8181"), "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--liveness=http://0.0.0.0:8181/healthz" in c["args"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["health"] == 8181
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_namespaced_mode_passes_namespace_flags_and_binds_roles_there() -> None:
    docs = render(values=CHART / "ci" / "namespaced-values.yaml")
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=ml-team-a" in args and "--namespace=ml-team-b" in args
    assert "--all-namespaces" not in args
    jobs_bindings = [d for d in by_kind(docs, "RoleBinding") if d["roleRef"]["name"].endswith("-jobs")]
    assert sorted(b["metadata"]["namespace"] for b in jobs_bindings) == ["ml-team-a", "ml-team-b"]
    assert not [d for d in by_kind(docs, "ClusterRoleBinding") if d["roleRef"]["name"].endswith("-jobs")]
    cluster_rules = one(docs, "ClusterRole", "-cluster")["rules"]
    assert not any("namespaces" in r["resources"] for r in cluster_rules)


def is_hook(doc: dict[str, Any]) -> bool:
    return "helm.sh/hook" in (doc["metadata"].get("annotations") or {})


def not_hooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if not is_hook(d)]


def all_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for d in docs if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda p: p.name if p else "defaults")
def test_rbac_has_no_secrets_and_no_wildcards(values: Path | None) -> None:
    rules = all_rules(render(values=values))
    assert rules
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        forbidden = {"secrets", "configmaps", "pods/exec", "pods/eviction", "pods/attach", "deployments"}
        assert not forbidden & set(rule["resources"])
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


@pytest.mark.parametrize(
    ("fsx", "kueue"),
    [(False, False), (True, False), (False, True)],
    ids=["fsx-off", "fsx-on", "kueue-on"],
)
def test_operator_rbac_grants_exactly_what_the_operator_uses(fsx: bool, kueue: bool) -> None:
    docs = render(f"fsx.enabled={str(fsx).lower()}", f"kueue.enabled={str(kueue).lower()}")
    granted = {
        (group, resource, verb)
        for d in by_kind(docs, "ClusterRole")
        if d["metadata"]["name"].endswith(("-cluster", "-jobs"))
        for r in d["rules"]
        for group in r["apiGroups"]
        for resource in r["resources"]
        for verb in r["verbs"]
    }

    def g(group: str, resource: str, *verbs: str) -> set[tuple[str, str, str]]:
        return {(group, resource, v) for v in verbs}

    expected = (
        g("training.resilient.dev", "resilienttrainingjobs", "get", "list", "watch", "patch", "delete")
        | g("training.resilient.dev", "resilienttrainingjobs/status", "get", "patch")
        | g("training.resilient.dev", "resilienttrainingjobs/finalizers", "update")
        | g("", "pods", "create", "delete", "get", "list", "watch", "patch")
        | g("", "services", "create", "list", "watch")
        | g("", "persistentvolumeclaims", "create")
        | g("coordination.k8s.io", "leases", "get", "list", "watch", "patch", "delete")
        | g("", "nodes", "get", "list", "watch", "patch")
        | g("", "events", "create")
        | g("apiextensions.k8s.io", "customresourcedefinitions", "get", "list", "watch")
        | g("", "namespaces", "list", "watch")
    )
    # Cluster-wide PersistentVolume rights only for FSx checkpoints, which need them: the job's PVs listed
    # by its labels (admit, cleanup), created, deleted under their UID; never get, watch, update, patch.
    if fsx:
        expected |= g("", "persistentvolumes", "create", "list", "delete")
    # Kueue's Workloads only with the integration on: created and watched, status patched (Finished,
    # admission cleared after an eviction), ResourceFlavors read by name; never update or delete.
    if kueue:
        expected |= (
            g("kueue.x-k8s.io", "workloads", "create", "list", "watch")
            | g("kueue.x-k8s.io", "workloads/status", "patch")
            | g("kueue.x-k8s.io", "resourceflavors", "get")
        )
    assert granted == expected
    assert env_of(one(docs, "Deployment"))["RTJ_FSX_ENABLED"] == str(fsx).lower()
    assert env_of(one(docs, "Deployment"))["RTJ_KUEUE_ENABLED"] == str(kueue).lower()


def test_trainer_role_only_touches_leases() -> None:
    docs = render("trainer.namespaces={ml-a,ml-b}")
    role = one(docs, "ClusterRole", "-trainer")
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["create", "patch"],
        }
    ]
    bindings = [d for d in by_kind(docs, "RoleBinding") if d["roleRef"]["name"] == role["metadata"]["name"]]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["ml-a", "ml-b"]
    for b in bindings:  # a RoleBinding: leases of its own namespace only
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": "rtj-trainer", "namespace": b["metadata"]["namespace"]}
        ]
    assert not [
        d for d in by_kind(docs, "ClusterRoleBinding") if d["roleRef"]["name"] == role["metadata"]["name"]
    ]
    sas = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in by_kind(docs, "ServiceAccount")}
    assert {("ml-a", "rtj-trainer"), ("ml-b", "rtj-trainer")} <= sas


def test_every_rbac_rule_is_commented() -> None:
    for template in ("rbac-operator.yaml", "rbac-trainer.yaml", "rbac-aggregate.yaml", "uninstall-hook.yaml"):
        lines = (CHART / "templates" / template).read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("- apiGroups:"):
                above = lines[i - 1].strip()
                assert above.startswith("#"), f"{template}:{i + 1} has no reason"


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "default")
def test_every_rtj_variable_the_chart_sets_is_a_setting_the_operator_reads(values: Path | None) -> None:
    env = env_of(one(render(values=values), "Deployment"))
    settings = {Settings.env_name(name) for name in Settings.model_fields}
    assert {name for name in env if name.startswith("RTJ_")} <= settings
    # ... and accepts their values (a pod's own fields, through the downward API, as the kubelet fills them)
    fields = {"metadata.namespace": "rtj-system", "metadata.name": "rtj-resilient-training-operator-abc12"}
    resolved = {k: v if isinstance(v, str) else fields[v["fieldRef"]["fieldPath"]] for k, v in env.items()}
    Settings.from_env(resolved)


def test_settings_reach_the_operator_env() -> None:
    env = env_of(one(render(), "Deployment"))
    assert env["RTJ_TRAINER_SERVICE_ACCOUNT"] == "rtj-trainer"
    assert env["RTJ_METRICS_PORT"] == "9090"


def test_metrics_service_and_service_monitor() -> None:
    docs = render(values=CHART / "ci" / "monitoring-values.yaml")
    svc = one(docs, "Service", "-metrics")
    assert svc["spec"]["ports"][0]["port"] == 9400
    assert env_of(one(docs, "Deployment"))["RTJ_METRICS_PORT"] == "9400"
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # The metrics name the training job job_namespace/job_name: the target's job/namespace labels stay.
    assert sm["spec"]["endpoints"][0]["honorLabels"] is False
    honored = one(render("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.honorLabels=true"),
                  "ServiceMonitor")  # fmt: skip
    assert honored["spec"]["endpoints"][0]["honorLabels"] is True
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert not by_kind(render(), "ServiceMonitor")


def test_dashboard_is_real_json_using_the_operator_metrics() -> None:
    docs = render(values=CHART / "ci" / "monitoring-values.yaml")
    cm = one(docs, "ConfigMap", "-dashboard")
    assert (
        cm["metadata"]["namespace"] == "monitoring" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    )
    dashboard = json.loads(cm["data"]["resilient-training-operator.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in METRICS:
        assert re.search(rf"\b{metric}\b", exprs), metric
    assert "histogram_quantile" in exprs


def test_names_are_truncated_to_63_characters() -> None:
    release = "a-very-long-release-name-that-goes-on-and-on-for-ever"  # Helm's limit is 53
    assert len(release) == 53
    docs = render("trainer.namespaces={ml}", "grafanaDashboard.enabled=true", release=release)
    docs += render("fullnameOverride=" + "x" * 63)
    for d in docs:
        name = d["metadata"]["name"]
        assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
    cluster_roles = [d["metadata"]["name"] for d in by_kind(docs, "ClusterRole")]
    assert len(set(cluster_roles)) == len(cluster_roles)


def test_values_schema_rejects_unknown_keys_and_bad_enums() -> None:
    for bad in ("bogus=1", "operator.logFormat=xml", "metrics.service.type=Ingress", "operator.bogus=1"):
        result = helm("template", "rtj", str(CHART), "--set", bad, check=False)
        assert result.returncode != 0, bad
    schema = json.loads((CHART / "values.schema.json").read_text())

    def check(node: dict[str, Any], path: str) -> None:
        assert node.get("description"), f"{path} has no description"
        if node.get("type") == "object" and "properties" in node:
            assert node["additionalProperties"] is False, path
            for name, sub in node["properties"].items():
                check(sub, f"{path}.{name}")

    check(schema, "values")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(schema["properties"]) - {"global"}  # Helm supplies `global`


def test_chart_metadata_and_crd_copy() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["kubeVersion"] == ">=1.31.0-0"
    assert (CHART / "crds" / crdgen.CRD_FILE).read_text() == (
        crdgen.REPO_ROOT / "crds" / crdgen.CRD_FILE
    ).read_text()
    assert "crds are not upgraded by helm" in (CHART / "README.md").read_text().lower()
    # The CRD is under crds/, never templated (Helm would delete every job on uninstall).
    assert not by_kind(render(), "CustomResourceDefinition")


def test_notes_tell_the_user_what_to_run_next() -> None:
    result = helm("install", "rtj", str(CHART), "--dry-run=client", "-n", "rtj-system", check=False)
    # A client-side dry run still renders NOTES.txt.
    assert "kubectl get rtj" in result.stdout, result.stderr


def test_operator_settings_env() -> None:
    deployment = one(render(values=CHART / "ci" / "namespaced-values.yaml"), "Deployment")
    assert env_of(deployment)["RTJ_LOG_LEVEL"] == "DEBUG"
    # Namespaces are kopf's options (the same for `kopf run -m rtj.handlers` and `python -m rtj`).
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--namespace=ml-team-a", "--namespace=ml-team-b"} <= set(args) and "--all-namespaces" not in args
    assert (
        "--all-namespaces" in one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    # Metrics off: the operator must not open its default metrics port (it could clash with the probes).
    docs = render("metrics.enabled=false")
    assert env_of(one(docs, "Deployment"))["RTJ_METRICS_PORT"] == "0"
    assert not [d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("-metrics")]
    clash = helm("template", "rtj", str(CHART), "--set", "metrics.port=8080", check=False)
    assert clash.returncode != 0 and "must differ" in clash.stderr


def test_accepts_helm_global_values_also_as_a_subchart(tmp_path: Path) -> None:
    assert render("global.imageRegistry=example.com")  # unknown keys elsewhere are still refused
    parent = tmp_path / "platform"
    (parent / "charts").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: platform\nversion: 1.0.0\n"
        "dependencies:\n  - name: resilient-training-operator\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text("global:\n  imageRegistry: example.com\n")
    (parent / "charts" / CHART.name).symlink_to(CHART, target_is_directory=True)
    result = helm("template", "platform", str(parent), "--namespace", "platform", check=False)
    assert result.returncode == 0, result.stderr
    assert "kind: Deployment" in result.stdout


def test_job_users_get_jobs_through_the_aggregated_edit_and_view_roles() -> None:
    docs = render()
    edit, view = one(docs, "ClusterRole", "-edit"), one(docs, "ClusterRole", "-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    edit_verbs = {v for r in edit["rules"] if "resilienttrainingjobs" in r["resources"] for v in r["verbs"]}
    assert {"create", "update", "patch", "delete", "get", "list", "watch"} <= edit_verbs
    # Nobody but the operator writes the status.
    for role in (edit, view):
        for r in role["rules"]:
            if "resilienttrainingjobs/status" in r["resources"]:
                assert set(r["verbs"]) <= {"get", "list", "watch"}
    assert {v for r in view["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    off = render("rbac.aggregateToDefaultRoles=false")
    assert not [d for d in by_kind(off, "ClusterRole") if d["metadata"]["name"].endswith(("-edit", "-view"))]


def test_an_external_service_account_must_be_named() -> None:
    unnamed = helm("template", "rtj", str(CHART), "--set", "serviceAccount.create=false", check=False)
    assert unnamed.returncode != 0 and "serviceAccount.name is required" in unnamed.stderr
    # The uninstall hook's own ServiceAccount and bindings exist only while it runs (not the operator's).
    docs = not_hooks(render("serviceAccount.create=false", "serviceAccount.name=platform-operator"))
    assert not by_kind(docs, "ServiceAccount")
    subjects = [s for d in by_kind(docs, "ClusterRoleBinding") for s in d["subjects"]]
    assert subjects and all(s["name"] == "platform-operator" for s in subjects)
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "platform-operator"


def image_of(docs: list[dict[str, Any]]) -> str:
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]


def test_image_tag_may_be_a_number_and_a_digest_pins_it() -> None:
    assert image_of(render("image.tag=20261130")).endswith(":20261130")
    digest = "sha256:" + "a" * 64
    assert image_of(render("image.tag=1.2.3", f"image.digest={digest}")).endswith(f":1.2.3@{digest}")
    assert image_of(render(f"image.digest={digest}")).endswith(f":0.1.0@{digest}")
    bad = helm("template", "rtj", str(CHART), "--set", "image.digest=latest", check=False)
    assert bad.returncode != 0


def test_helm_test_hook_checks_the_crd_and_the_operator() -> None:
    docs = render()
    test_pod = one(docs, "Pod", "-test")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    # Outside the Deployment's selector (its ReplicaSet would adopt the pod) and the Service's.
    selector = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= test_pod["metadata"]["labels"].items()
    spec = test_pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = spec["containers"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    script = c["args"][0]
    compile(script, "helm-test", "exec")  # valid Python once rendered
    assert "/apis/training.resilient.dev/v1alpha1" in script
    assert "http://rtj-resilient-training-operator-metrics.rtj-system.svc:9090/metrics" in script
    # No operator pod to ask (replicas=0, e.g. a local cluster): only the CRD is checked.
    local = one(render(values=CHART / "ci" / "local-values.yaml"), "Pod", "-test")
    assert "/metrics" not in local["spec"]["containers"][0]["args"][0].split("metrics = ")[1].split("\n")[0]


def test_trainer_namespaces_are_created_only_when_asked() -> None:
    assert not by_kind(render("trainer.namespaces={ml-a}"), "Namespace")
    docs = render("trainer.namespaces={ml-a}", "trainer.createNamespaces=true")
    (ns,) = by_kind(docs, "Namespace")
    assert ns["metadata"]["name"] == "ml-a"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert ns["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_liveness_and_metrics_ports_differ_by_default() -> None:
    from rtj.settings import Settings

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["operator"]["healthPort"] != values["metrics"]["port"]
    # The operator image's own default liveness port (Dockerfile CMD) must not be the metrics default.
    dockerfile = (crdgen.REPO_ROOT / "Dockerfile").read_text()
    (liveness,) = re.findall(r"--liveness=http://0\.0\.0\.0:(\d+)/healthz", dockerfile)
    assert Settings().metrics_port == Settings.from_env().metrics_port != int(liveness)
    assert Settings().metrics_port == values["metrics"]["port"]


def test_notes_and_readme_say_what_a_local_cluster_needs() -> None:
    result = helm("install", "rtj", str(CHART), "--dry-run=client", "-n", "rtj-system", check=False)
    assert "operator.replicas=0" in result.stdout and "ci/local-values.yaml" in result.stdout
    assert "helm test rtj" in result.stdout
    readme = (CHART / "README.md").read_text()
    assert "operator.replicas=0" in readme and "trainer.createNamespaces" in readme


def test_on_local_kubelet_nodes_the_operator_leaves_a_dead_node_within_seconds() -> None:
    # The operator pod shares the kubelet nodes with the jobs: when its node dies (the e2e node-death
    # row, the demo), its replacement must run long before the 300 s default toleration ends.
    docs = render(values=CHART / "ci" / "kubelet-values.yaml")
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "localhost/rtj-operator:local"
    tolerations = pod["tolerations"]
    noexecute = {t["key"]: t.get("tolerationSeconds") for t in tolerations if t["effect"] == "NoExecute"}
    assert set(noexecute) == {"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"}
    assert all(0 < s <= 15 for s in noexecute.values()), noexecute


# --- the uninstall hook (templates/uninstall-hook.yaml, rtj.uninstall) ------------------------------------
def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def uninstall_hook(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["metadata"]["labels"].get("app.kubernetes.io/component") == "uninstall-cleanup"
    ]


def hook_job(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = by_kind(uninstall_hook(docs), "Job")
    return job


def test_uninstall_hook_runs_the_cleanup_command_after_the_release_is_deleted() -> None:
    from rtj import uninstall

    docs = render()
    hook = uninstall_hook(docs)
    assert sorted(d["kind"] for d in hook) == [
        "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "Job", "ServiceAccount",
    ]  # fmt: skip
    # Every object is a post-delete hook, replaced by the next uninstall's and deleted once it succeeded;
    # its ServiceAccount and RBAC (lower weight) exist before the Job.
    for d in hook:
        annotations = d["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "post-delete", d["metadata"]["name"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    weight = {d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in hook}
    assert max(w for kind, w in weight.items() if kind != "Job") < weight["Job"]
    others = {d["metadata"]["annotations"]["helm.sh/hook"] for d in docs if is_hook(d) and d not in hook}
    assert others == {"test"}  # the one other hook: `helm test`
    job = hook_job(docs)
    assert 0 < job["spec"]["activeDeadlineSeconds"] <= 300 and 0 <= job["spec"]["backoffLimit"] <= 3
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (sa,) = by_kind(hook, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"] != "default"
    assert sa["metadata"]["namespace"] == job["metadata"]["namespace"] == "rtj-system"
    (c,) = pod["containers"]
    assert c["image"] == image_of(docs)  # the operator image: it has `python -m rtj`
    assert c["command"] == ["python", "-m", "rtj", uninstall.COMMAND]
    # The command accepts the chart's arguments: all namespaces; no PV rights without fsx.enabled.
    args = uninstall.parse_args(c.get("args") or [])
    assert args.namespace == [] and args.keep_pvs is True
    (fsx_container,) = hook_job(render("fsx.enabled=true"))["spec"]["template"]["spec"]["containers"]
    args = uninstall.parse_args(fsx_container.get("args") or [])
    assert args.namespace == [] and args.keep_pvs is False
    spec = hook_job(render("operator.watchNamespaces={ml-a,ml-b}"))["spec"]["template"]["spec"]
    assert uninstall.parse_args(spec["containers"][0]["args"]).namespace == ["ml-a", "ml-b"]
    # Outside every selector of the release (the Deployment's ReplicaSet, the metrics Service).
    selector = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= job["spec"]["template"]["metadata"]["labels"].items()


def test_uninstall_hook_pod_meets_the_restricted_pod_security_standard() -> None:
    pod = hook_job(render())["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"].get("runAsUser", 65532) != 0
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC", "volumes"))
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True and sc.get("privileged") is not True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


@pytest.mark.parametrize("fsx", [False, True], ids=["fsx-off", "fsx-on"])
@pytest.mark.parametrize("watch", [[], ["ml-a", "ml-b"]], ids=["all-namespaces", "watch-namespaces"])
def test_uninstall_hook_rbac_grants_exactly_what_the_command_uses(fsx: bool, watch: list[str]) -> None:
    args = [f"fsx.enabled={str(fsx).lower()}"] + ([f"operator.watchNamespaces={{{','.join(watch)}}}"] if watch
                                                   else [])  # fmt: skip
    hook = uninstall_hook(render(*args))
    sa = by_kind(hook, "ServiceAccount")[0]["metadata"]
    subject = {"kind": "ServiceAccount", "name": sa["name"], "namespace": "rtj-system"}
    roles = {d["metadata"]["name"]: d for d in by_kind(hook, "ClusterRole")}
    assert not by_kind(hook, "Role")

    def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
        return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
                for v in rule["verbs"]}  # fmt: skip

    # Cluster-wide: nodes (every quarantine lifted) and, with FSx only, the PV of a job being deleted.
    (cluster_binding,) = by_kind(hook, "ClusterRoleBinding") if watch else [
        b for b in by_kind(hook, "ClusterRoleBinding") if b["roleRef"]["name"] == sa["name"]
    ]  # fmt: skip
    assert cluster_binding["subjects"] == [subject]
    expected = {("", "nodes", v) for v in ("get", "list", "patch")}
    if fsx:
        expected |= {("", "persistentvolumes", v) for v in ("list", "delete")}
    assert grants(roles[cluster_binding["roleRef"]["name"]]) == expected
    # The jobs' finalizers: where the operator watches jobs (everywhere, or each watched namespace).
    jobs_role = roles[next(n for n in roles if n != cluster_binding["roleRef"]["name"])]
    assert grants(jobs_role) == {("training.resilient.dev", "resilienttrainingjobs", v)
                                 for v in ("get", "list", "patch")}  # fmt: skip
    bindings = [b for b in by_kind(hook, "ClusterRoleBinding") + by_kind(hook, "RoleBinding")
                if b["roleRef"]["name"] == jobs_role["metadata"]["name"]]  # fmt: skip
    assert all(b["subjects"] == [subject] for b in bindings)
    if watch:
        assert sorted((b["kind"], b["metadata"]["namespace"]) for b in bindings) == [
            ("RoleBinding", ns) for ns in watch
        ]
    else:
        assert [b["kind"] for b in bindings] == ["ClusterRoleBinding"]


def test_uninstall_hook_is_on_by_default_and_can_be_turned_off() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["uninstallCleanup"] == {"enabled": True}
    assert uninstall_hook(render())
    off = render("uninstallCleanup.enabled=false")
    assert not uninstall_hook(off)
    assert not [
        d for d in off if "delete" in (d["metadata"].get("annotations") or {}).get("helm.sh/hook", "")
    ]
    assert (
        helm("template", "rtj", str(CHART), "--set", "uninstallCleanup.bogus=1", check=False).returncode != 0
    )
    # NOTES.txt says what `helm uninstall` does, and what to run instead when the hook is off.
    notes = helm("install", "rtj", str(CHART), "--dry-run=client", "-n", "rtj-system").stdout
    assert "its post-delete hook then lifts every node quarantine" in flat(notes)
    notes = helm("install", "rtj", str(CHART), "--dry-run=client", "-n", "rtj-system",
                 "--set", "uninstallCleanup.enabled=false").stdout  # fmt: skip
    assert "kubectl taint nodes --all training.resilient.dev/quarantined-" in notes


def test_uninstall_hook_runs_where_the_operator_may() -> None:
    docs = render(values=CHART / "ci" / "kubelet-values.yaml")
    operator_pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    pod = hook_job(docs)["spec"]["template"]["spec"]
    assert pod["tolerations"] == operator_pod["tolerations"]
    assert pod["containers"][0]["imagePullPolicy"] == "Never"
    docs = render("operator.nodeSelector.pool=system", "imagePullSecrets[0].name=regcred")
    pod = hook_job(docs)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "system"} and pod["imagePullSecrets"] == [{"name": "regcred"}]
