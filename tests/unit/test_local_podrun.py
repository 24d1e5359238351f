"""rtj_local.podrun: what the local node agent makes of a pod spec (pure; no processes)."""

from __future__ import annotations

import pytest
from rtj_local.podrun import (
    DEFAULT_SHM_SIZE,
    SA_MOUNT_PATH,
    Mount,
    PlanContext,
    PodSpecError,
    VolumeSource,
    expand,
    host_mount_points,
    launcher_argv,
    plan_pod,
)

pytestmark = pytest.mark.unit


def ctx(**overrides) -> PlanContext:
    base = dict(
        venv_bin="/repo/.venv/bin",
        apiserver_host="127.0.0.1",
        apiserver_port=6443,
        hosts_file="/run/agent/hosts",
        tmp_dir="/run/agent/pods/p/tmp",
        volumes={},
        node_allocatable={"cpu": "192", "memory": "2048Gi"},
    )
    base.update(overrides)
    return PlanContext(**base)


def pod(container: dict, **spec) -> dict:
    return {
        "metadata": {"name": "job-n0-a1", "namespace": "ns1", "uid": "u-1", "labels": {"slot": "0"}},
        "spec": {
            "nodeName": "local-p5-0",
            "serviceAccountName": "rtj-trainer",
            "containers": [container],
            **spec,
        },
    }


def test_command_args_and_downward_api_env() -> None:
    container = {
        "name": "trainer",
        "command": ["rtj-trainer", "launch"],
        "args": ["--pod", "$(POD)", "$$(LITERAL)"],
        "env": [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "SLOT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['slot']"}}},
            {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "GREETING", "value": "pod $(POD) in $(NS) $(UNDEFINED)"},
        ],
    }
    plan = plan_pod(pod(container), ctx())
    assert plan.argv == ["rtj-trainer", "launch", "--pod", "job-n0-a1", "$(LITERAL)"]
    env = plan.env
    assert (env["POD"], env["NS"], env["UID"], env["NODE"]) == ("job-n0-a1", "ns1", "u-1", "local-p5-0")
    assert env["IP"] == env["HOST_IP"] == "127.0.0.1"
    assert env["SLOT"] == "0"
    assert env["CPUS"] == "192"  # no limit: node allocatable, as kubelet does
    assert env["GREETING"] == "pod job-n0-a1 in ns1 $(UNDEFINED)"
    assert env["PATH"].startswith("/repo/.venv/bin:")
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "6443")
    assert plan.uid is None


def test_env_from_config_map_and_secret_keys() -> None:
    container = {
        "name": "c",
        "command": ["true"],
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {
                "name": "MISSING_OK",
                "valueFrom": {"secretKeyRef": {"name": "s", "key": "nope", "optional": True}},
            },
        ],
    }
    plan = plan_pod(pod(container), ctx(config_maps={"cm": {"A": "1"}}, secrets={"s": {"pw": "hunter2"}}))
    assert plan.env["CM_A"] == "1"
    assert plan.env["PASSWORD"] == "hunter2"
    assert "MISSING_OK" not in plan.env
    with pytest.raises(PodSpecError, match="configMapRef 'cm' not found"):
        plan_pod(pod(container), ctx(secrets={"s": {"pw": "x"}}))


def test_mounts_private_tmp_shm_hosts_and_volumes_parents_first() -> None:
    container = {
        "name": "c",
        "command": ["true"],
        "volumeMounts": [
            {"name": "ckpt", "mountPath": "/checkpoints"},
            {"name": "sa", "mountPath": SA_MOUNT_PATH, "readOnly": True},
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "scratch", "mountPath": "/tmp/scratch"},
            {"name": "ckpt", "mountPath": "/data/sub", "subPath": "a/b"},
        ],
    }
    volumes = {
        "ckpt": VolumeSource(path="/run/agent/volumes/pv/ckpt"),
        "sa": VolumeSource(path="/run/agent/pods/p/volumes/sa"),
        "shm": VolumeSource(tmpfs_size="1Gi"),
        "scratch": VolumeSource(path="/run/agent/pods/p/volumes/scratch"),
    }
    plan = plan_pod(pod(container), ctx(volumes=volumes))
    by_target = {m.target: m for m in plan.mounts}
    assert by_target["/tmp"] == Mount("/tmp", source="/run/agent/pods/p/tmp")
    assert by_target["/dev/shm"] == Mount("/dev/shm", tmpfs_size="1Gi")  # the volume replaces the default
    assert by_target["/etc/hosts"].read_only
    assert by_target[SA_MOUNT_PATH] == Mount(
        SA_MOUNT_PATH, source="/run/agent/pods/p/volumes/sa", read_only=True
    )
    assert by_target["/data/sub"].source == "/run/agent/volumes/pv/ckpt/a/b"
    targets = [m.target for m in plan.mounts]
    assert targets.index("/tmp") < targets.index("/tmp/scratch")


def test_default_shm_is_small_like_a_container_runtime() -> None:
    plan = plan_pod(pod({"name": "c", "command": ["true"]}), ctx())
    assert Mount("/dev/shm", tmpfs_size=DEFAULT_SHM_SIZE) in plan.mounts


@pytest.mark.parametrize(
    ("container", "spec", "message"),
    [
        ({"name": "c", "image": "x"}, {}, "explicit command"),
        (
            {"name": "c", "command": ["x"], "volumeMounts": [{"name": "nope", "mountPath": "/x"}]},
            {},
            "no such",
        ),
        ({"name": "c", "command": ["x"]}, {"initContainers": [{"name": "i"}]}, "exactly one container"),
        (
            {
                "name": "c",
                "command": ["x"],
                "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.x"}}}],
            },
            {},
            "unsupported fieldRef",
        ),
    ],
)
def test_pods_the_agent_cannot_run_get_a_clear_error(container: dict, spec: dict, message: str) -> None:
    with pytest.raises(PodSpecError, match=message):
        plan_pod(pod(container, **spec), ctx())


def test_run_as_non_root_without_a_user_runs_as_the_agent_like_an_image_user() -> None:
    container = {"name": "c", "command": ["python", "-c", "print(1)"]}
    plan = plan_pod(pod(container, securityContext={"runAsNonRoot": True, "fsGroup": 2000}), ctx())
    assert plan.uid is None and plan.groups == [2000]


def test_security_context_user_and_groups_become_setpriv() -> None:
    container = {"name": "c", "command": ["python", "-c", "print(1)"], "securityContext": {"runAsUser": 1000}}
    plan = plan_pod(pod(container, securityContext={"runAsGroup": 1000, "fsGroup": 2000}), ctx())
    assert (plan.uid, plan.gid, plan.groups) == (1000, 1000, [2000])
    argv = launcher_argv(plan)
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    tail = argv[argv.index("rtj-pod") + 1 :]
    assert tail == [
        "setpriv",
        "--reuid=1000",
        "--regid=1000",
        "--groups=2000",
        "--",
        "python",
        "-c",
        "print(1)",
    ]


def test_launcher_script_mounts_then_execs() -> None:
    plan = plan_pod(pod({"name": "c", "command": ["sh", "-c", "echo hi; exit 3"]}), ctx())
    argv = launcher_argv(plan)
    script = argv[argv.index("-c") + 1]
    assert f"mount -t tmpfs -o mode=1777,size={64 << 20} tmpfs /dev/shm" in script
    assert "mount --bind /run/agent/hosts /etc/hosts" in script
    assert "mount -o remount,bind,ro /etc/hosts" in script
    assert script.splitlines()[-1] == 'exec "$@"'
    assert argv[-3:] == ["sh", "-c", "echo hi; exit 3"]


def test_host_mount_points_lists_missing_dirs_deepest_first() -> None:
    plan = plan_pod(
        pod({"name": "c", "command": ["x"], "volumeMounts": [{"name": "sa", "mountPath": SA_MOUNT_PATH}]}),
        ctx(volumes={"sa": VolumeSource(path="/v/sa")}),
    )
    existing = {"/var", "/var/run", "/etc/hosts", "/dev/shm", "/dev"}
    created = host_mount_points(plan, lambda p: p in existing)
    assert created == [SA_MOUNT_PATH, "/var/run/secrets/kubernetes.io", "/var/run/secrets"]


def test_expand() -> None:
    assert expand("$(A)-$(B)-$$(A)-$(", {"A": "1"}) == "1-$(B)-$(A)-$("


def test_a_project_under_tmp_stays_visible_in_the_pods_private_tmp(tmp_path) -> None:
    """A clone under /tmp (its virtualenv and editable sources) must survive /tmp being replaced."""
    import subprocess

    from rtj_local.podrun import Mount, ProcessPlan, launcher_argv

    project, pod_tmp = tmp_path / "project", tmp_path / "podtmp"
    (project / "bin").mkdir(parents=True)
    (project / "bin" / "tool").write_text("x\n")
    pod_tmp.mkdir()
    plan = ProcessPlan(
        container="c",
        argv=["sh", "-c", f"cat {project}/bin/tool && ls /tmp"],
        env={},
        cwd="/tmp",
        mounts=[Mount("/tmp", source=str(pod_tmp))],
        keep_visible=(str(project),),
    )
    done = subprocess.run(launcher_argv(plan), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "x"
    assert str(tmp_path).split("/")[2] in done.stdout  # only the kept path's top dir is in the pod's /tmp
