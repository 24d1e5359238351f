"""Hypothesis strategies for ResilientTrainingJob specs around the API's boundaries, and the oracle
that says which of them the API server must accept.

A spec is drawn as a mostly valid base (each field omitted, at a bound, or in range) plus zero to
three mutations (a bound crossed by one, a wrong JSON type, a broken pattern, an unknown field, a
CEL cross-field rule broken, a hostPath volume). About half the specs come out invalid.

The oracle is the pydantic API model (`JobSpec.model_validate`, strict: JSON types are not coerced,
as the API server does not coerce them) plus the CEL cross-field rules of the CRD, re-stated here in
Python and evaluated on the defaulted model. Before validation, `null` values of declared fields are
dropped (the API server prunes nulls of non-nullable fields before defaulting and validation, and
the operator only ever reads the pruned object), and integral floats (7.0) count as integers, as
OpenAPI's `integer` type and the operator's lax parsing both take them, except where a CEL rule has
to read one (`cel_type_errors`), and a JSON integer beyond 64 bits is a float to the API server.
"""

from __future__ import annotations

import copy
import string
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from pydantic import ValidationError
from rtj import contract
from rtj.api.models import RESERVED_VOLUMES, SHM_MOUNT_PATH, JobSpec, qualified_name_error

API_VERSION = f"{contract.API_GROUP}/{contract.API_VERSION}"

# --- leaf strategies (built once: strategy construction is what costs in hypothesis) ---------------
_ALNUM = string.ascii_lowercase + string.digits
_PRINTABLE = string.ascii_letters + string.digits + "-._/:@ "
_TEXT = st.one_of(
    st.text(st.sampled_from(_PRINTABLE), max_size=12),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6),
)


def ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """In range, with the bounds themselves drawn often."""
    return st.one_of(st.sampled_from([lo, hi]), st.integers(lo, min(hi, lo + 50)), st.integers(lo, hi))


def sized(n: int) -> st.SearchStrategy[str]:
    """A string of exactly n characters (one repeated character: cheap to draw at any size)."""
    return st.sampled_from(["a", "Z", "\u00e9", "-", "\u6f22"]).map(lambda c: c * n)


def texts(max_len: int, min_len: int = 0) -> st.SearchStrategy[str]:
    """Valid-length strings, including exactly max_len and min_len characters."""
    short = _TEXT.filter(lambda t: min_len <= len(t) <= max_len)
    return st.one_of(short, sized(max_len), sized(min_len))


DNS_LABEL = st.one_of(
    st.sampled_from(["ckpt", "a", "x-1", "9", "a" * 63]),
    st.text(st.sampled_from(_ALNUM), min_size=1, max_size=12),
)
LABEL_KEY = st.one_of(
    st.sampled_from(["zone", "example.com/pool", "a", "k8s.io/x_y.z", "node-group", "A.b_c", "a" * 63]),
    st.sampled_from(["a" * 253 + "/b", "x." * 126 + "x/" + "n" * 63]),  # longest prefix, longest name
    st.text(st.sampled_from(_ALNUM), min_size=1, max_size=8),
    st.builds(
        "{}/{}".format,
        st.sampled_from(["example.com", "k8s.io", "a"]),
        st.text(st.sampled_from(_ALNUM), min_size=1, max_size=8),
    ),
)
LABEL_VALUE = st.one_of(
    st.sampled_from(["", "a", "v1", "A_b.c-9", "a" * 63]), st.text(st.sampled_from(_ALNUM), max_size=12)
)
#: Images without whitespace at either end (the API server refuses such a container image).
IMAGE = st.one_of(
    st.sampled_from(["trainer:1", "123.dkr.ecr.us-east-1.amazonaws.com/t:0.1", "a b", "a" * 512]),
    st.text(st.sampled_from(_PRINTABLE.replace(" ", "")), min_size=1, max_size=12),
    sized(512),
)
QUANTITY = st.one_of(
    st.sampled_from(["1", "180", "500m", "1800Gi", "64Gi", "0", "1.5", "2Ti", "100k", "1P"]),
    st.integers(0, 10**6),
)
#: A volume capacity: a quantity above zero.
POSITIVE_QUANTITY = st.one_of(
    st.sampled_from(["1", "180", "500m", "1800Gi", "0.5", "1.5", "2Ti", "100k", "1P"]),
    st.integers(1, 10**6),
)
BAD_QUANTITY = st.sampled_from(
    ["1e3", "-1", "1.5.5", "12XB", "", " 1Gi", "0x10", "1Gi ", "+1", -1, -500, 1.5]
)
FSX = st.fixed_dictionaries(
    {
        "fileSystemId": st.sampled_from(["fs-0123456789abcdef0", "fs-01234567", "fs-0123456789abcdef0"[:20]]),
        "dnsName": st.sampled_from(["fs-0123.fsx.us-east-1.amazonaws.com", "a", "a" * 253]),
        "mountName": st.sampled_from(["abcdefgh", "a", "a" * 16, "fsx"]),
    },
    optional={"storageCapacity": POSITIVE_QUANTITY},
)


@st.composite
def toleration(draw: st.DrawFn) -> dict[str, Any]:
    """A toleration the API server takes: Exists (any key, no value) or Equal (a key and a value);
    tolerationSeconds only with NoExecute. Fields at their defaults are sometimes left out."""
    effect = draw(st.sampled_from(["", "NoSchedule", "PreferNoSchedule", "NoExecute"]))
    if draw(st.booleans()):
        tol = {"operator": "Exists", "key": draw(st.one_of(st.just(""), LABEL_KEY))}
    else:
        tol = {"key": draw(LABEL_KEY), "value": draw(LABEL_VALUE)}
        if draw(st.booleans()):
            tol["operator"] = "Equal"
    if effect or draw(st.booleans()):
        tol["effect"] = effect
    if effect == "NoExecute" and draw(st.booleans()):
        tol["tolerationSeconds"] = draw(ints(0, 2**31 - 1))
    return tol


AFFINITY = st.sampled_from(
    [
        {},
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        {"somethingElse": 1},
    ]
)
VOLUME = st.one_of(
    st.builds(lambda n: {"name": n, "emptyDir": {}}, DNS_LABEL),
    st.builds(lambda n: {"name": n, "configMap": {"name": "cm"}}, DNS_LABEL),
)
#: Mount paths of podTemplate.volumeMounts (none is /dev/shm or a checkpoint.mountPath drawn here).
MOUNT_PATHS = ["/data", "/x/y", "/mnt/a b", "/" + "m" * 1023]

BASE = st.fixed_dictionaries(
    {
        "image": IMAGE,
        "command": st.one_of(
            st.just(["python", "train.py"]), st.lists(texts(4096, 1), min_size=1, max_size=3)
        ),
        "nodes": ints(1, 10000),
        "checkpoint": st.one_of(
            st.builds(lambda c: {"pvc": {"claimName": c}}, DNS_LABEL),
            st.builds(lambda f: {"fsx": f}, FSX),
        ),
    },
    optional={
        "args": st.lists(texts(4096), max_size=3),
        "env": st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["A", "_x", "my.var-1", "-", "a" * 256])},
                optional={"value": st.one_of(_TEXT, sized(32768))},
            ),
            max_size=3,
            unique_by=lambda e: e["name"],
        ),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "efaPerNode": ints(0, 32),
                "cpu": QUANTITY,
                "memory": QUANTITY,
                "sharedMemorySize": QUANTITY,
            },
        ),
        "placement": st.fixed_dictionaries(
            {},
            optional={
                "instanceType": st.one_of(
                    st.sampled_from(["p5.48xlarge", "p5e.48xlarge", "a" * 63]), LABEL_VALUE.filter(bool)
                ),
                "nodeSelector": st.dictionaries(LABEL_KEY, LABEL_VALUE, max_size=3),
                "tolerations": st.lists(toleration(), max_size=2),
                "affinity": AFFINITY,
            },
        ),
        "hotSpares": ints(0, 64),
        "suspend": st.booleans(),
        "ttlSecondsAfterFinished": ints(0, 2**31 - 1),
        "podTemplate": st.fixed_dictionaries(
            {},
            optional={
                "serviceAccountName": DNS_LABEL,
                "labels": st.dictionaries(LABEL_KEY, LABEL_VALUE, max_size=3),
                "annotations": st.dictionaries(LABEL_KEY, st.one_of(_TEXT, sized(2048)), max_size=3),
                "priorityClassName": texts(253),
                "volumes": st.lists(VOLUME, max_size=2, unique_by=lambda v: v["name"]),
            },
        ),
    },
)
CHECKPOINT_EXTRA = st.fixed_dictionaries(
    {},
    optional={
        "mountPath": st.sampled_from(["/checkpoints", "/", "/a/b c", "/" + "a" * 1023]),
        "intervalSteps": ints(1, 10_000_000),
        "keep": ints(1, 100),
    },
)
FT_EXTRA = st.fixed_dictionaries(
    {},
    optional={
        "rankHangTimeoutSeconds": ints(1, 86400),
        "maxInJobRestarts": ints(0, 1000),
        "maxPodReschedules": ints(0, 1000),
        "maxNoProgressCycles": ints(1, 1000),
        "quarantineFaultyNodes": st.booleans(),
        "doNotRestartExitCodes": st.lists(ints(1, 255), max_size=32),
    },
)


@st.composite
def valid_spec(draw: st.DrawFn) -> dict[str, Any]:
    """A spec that satisfies every bound and every cross-field rule (bounds drawn often)."""
    spec = draw(BASE)
    spec["checkpoint"].update(draw(CHECKPOINT_EXTRA))
    template = spec.get("podTemplate")
    if template is not None and draw(st.booleans()):
        names = [*RESERVED_VOLUMES, *(v["name"] for v in template.get("volumes", []))]
        paths = draw(st.lists(st.sampled_from(MOUNT_PATHS), max_size=2, unique=True))
        template["volumeMounts"] = [{"name": draw(st.sampled_from(names)), "mountPath": p} for p in paths]
    if draw(st.booleans()):
        gpus = draw(ints(0, 8))
        spec["gpusPerNode"] = gpus
        if draw(st.booleans()):
            spec["procsPerNode"] = draw(ints(1, 64)) if gpus == 0 else draw(ints(1, gpus))
    if draw(st.booleans()):
        interval = draw(ints(1, 300))
        timeout = draw(ints(max(2, interval + 1), 3600))
        ft = {
            "heartbeatIntervalSeconds": interval,
            "heartbeatTimeoutSeconds": timeout,
            "startupTimeoutSeconds": draw(ints(timeout, 86400)),
            **draw(FT_EXTRA),
        }
        if draw(st.booleans()):
            soft = draw(ints(1, 86399))
            ft["inProcessRestart"] = {
                "enabled": draw(st.booleans()),
                "softTimeoutSeconds": soft,
                "hardTimeoutSeconds": draw(ints(soft + 1, 86400)),
                "maxRestarts": draw(ints(0, 10000)),
            }
        spec["faultTolerance"] = ft
    return spec


# --- mutations: each one pushes one thing just across a boundary (or leaves it valid by chance) ----------
#: (path, lowest valid, highest valid) of every bounded integer.
INT_BOUNDS: list[tuple[tuple[str, ...], int, int]] = [
    (("nodes",), 1, 10000),
    (("gpusPerNode",), 0, 8),
    (("procsPerNode",), 1, 64),
    (("hotSpares",), 0, 64),
    (("ttlSecondsAfterFinished",), 0, 2**31 - 1),
    (("resources", "efaPerNode"), 0, 32),
    (("checkpoint", "intervalSteps"), 1, 10_000_000),
    (("checkpoint", "keep"), 1, 100),
    (("faultTolerance", "heartbeatIntervalSeconds"), 1, 300),
    (("faultTolerance", "heartbeatTimeoutSeconds"), 2, 3600),
    (("faultTolerance", "startupTimeoutSeconds"), 2, 86400),
    (("faultTolerance", "rankHangTimeoutSeconds"), 1, 86400),
    (("faultTolerance", "maxInJobRestarts"), 0, 1000),
    (("faultTolerance", "maxPodReschedules"), 0, 1000),
    (("faultTolerance", "maxNoProgressCycles"), 1, 1000),
    (("faultTolerance", "inProcessRestart", "softTimeoutSeconds"), 1, 86400),
    (("faultTolerance", "inProcessRestart", "hardTimeoutSeconds"), 2, 86400),
    (("faultTolerance", "inProcessRestart", "maxRestarts"), 0, 10000),
    (("podTemplate", "securityContext", "runAsUser"), 1, 2**31 - 1),
    (("podTemplate", "securityContext", "runAsGroup"), 0, 2**31 - 1),
    (("podTemplate", "securityContext", "fsGroup"), 0, 2**31 - 1),
]
#: (path, max length, min length) of every bounded string.
STR_BOUNDS: list[tuple[tuple[str, ...], int, int]] = [
    (("image",), 512, 1),
    (("placement", "instanceType"), 63, 1),
    (("checkpoint", "mountPath"), 1024, 1),
    (("podTemplate", "priorityClassName"), 253, 0),
    (("checkpoint", "pvc", "claimName"), 63, 1),
]
#: (path, an invalid value) for patterns and enums.
PATTERN_BREAKS: list[tuple[tuple[str, ...], Any]] = [
    (("checkpoint", "pvc", "claimName"), "Bad_Name"),
    (("checkpoint", "pvc", "claimName"), "-x"),
    (("checkpoint", "mountPath"), "relative"),
    (("checkpoint", "mountPath"), "/a:b"),
    (("podTemplate", "serviceAccountName"), "Bad.SA"),
    (("podTemplate", "securityContext", "fsGroupChangePolicy"), "Sometimes"),
    (("podTemplate", "securityContext", "seccompProfile"), {"type": "Unconfined"}),
    (("podTemplate", "securityContext", "seccompProfile"), {"type": "Localhost"}),
    (
        ("podTemplate", "securityContext", "seccompProfile"),
        {"type": "RuntimeDefault", "localhostProfile": "p"},
    ),
    (("podTemplate", "securityContext", "seccompProfile"), {"type": "Localhost", "localhostProfile": "/abs"}),
    (("placement", "tolerations"), [{"operator": "In"}]),
    (("placement", "tolerations"), [{"effect": "Sometimes"}]),
    (("placement", "tolerations"), [{"tolerationSeconds": -1}]),
    (("placement", "tolerations"), [{}]),  # Equal with an empty key
    (("placement", "tolerations"), [{"operator": "Exists", "value": "x"}]),
    (("placement", "tolerations"), [{"key": "k", "value": "v", "tolerationSeconds": 5}]),
    (("placement", "tolerations"), [{"key": "bad key", "operator": "Exists"}]),
    (("placement", "tolerations"), [{"key": "k", "value": "-v"}]),
    (("placement", "instanceType"), "-"),
    (("placement", "instanceType"), "\u6f22"),
    (("image",), " trainer:1"),
    (("image",), "trainer:1\u0085"),
    (("image",), "\u00a0trainer:1"),
    (("checkpoint", "mountPath"), "/dev/shm"),
    (("env",), [{"name": "1BAD"}]),
    (("env",), [{"name": "A=B"}]),
    (("env",), [{"name": ""}]),
    (("env",), [{"name": "a" * 257}]),
    (("env",), [{"name": "A", "value": "v" * 32769}]),
    (("env",), [{"name": "RTJ_TRAINER_CONFIG", "value": "{}"}]),  # the runtime's
    (("env",), [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),  # twice
    (("command",), []),
    (("command",), [""]),
    (("command",), ["x" * 4097]),
    (("args",), ["x" * 4097]),
    (("faultTolerance", "doNotRestartExitCodes"), [0]),
    (("faultTolerance", "doNotRestartExitCodes"), [256]),
    (("faultTolerance", "doNotRestartExitCodes"), list(range(1, 34))),
    (("placement", "nodeSelector"), {"k": "v" * 64}),
    (("placement", "nodeSelector"), {"k": "-v"}),
    (("placement", "nodeSelector"), {"bad key": "v"}),
    (("placement", "nodeSelector"), {"a/b/c": "v"}),
    (("podTemplate", "labels"), {"k": "v" * 64}),
    (("podTemplate", "labels"), {"k": "a b"}),
    (("podTemplate", "labels"), {"a" * 64: "v"}),
    (("podTemplate", "labels"), {"a" * 254 + "/b": "v"}),
    (("podTemplate", "labels"), {"Example.com/a": "v"}),
    (("podTemplate", "labels"), {"-a": "v"}),
    (("podTemplate", "annotations"), {"bad key": "v"}),
    (("podTemplate", "annotations"), {"k": "v" * 2049}),
    (("podTemplate", "volumes"), [{"name": "rtj-dshm", "emptyDir": {}}]),
    (("podTemplate", "volumes"), [{"name": "rtj-checkpoints", "emptyDir": {}}]),
    (("podTemplate", "volumes"), [{"name": "a", "emptyDir": {}}, {"name": "a", "configMap": {"name": "c"}}]),
    (("podTemplate", "volumes"), [{"name": "Bad_Name", "emptyDir": {}}]),
    (("podTemplate", "volumeMounts"), [{"name": "nope", "mountPath": "/x"}]),
    (("podTemplate", "volumeMounts"), [{"name": "rtj-dshm", "mountPath": "/dev/shm"}]),
    (("podTemplate", "volumeMounts"), [{"name": "rtj-checkpoints", "mountPath": "/checkpoints"}]),
    (
        ("podTemplate", "volumeMounts"),
        [{"name": "rtj-dshm", "mountPath": "/a"}, {"name": "rtj-dshm", "mountPath": "/a"}],
    ),
    (("podTemplate", "volumeMounts"), [{"name": "rtj-dshm"}]),
    (("podTemplate", "volumeMounts"), [{"name": "rtj-dshm", "mountPath": "relative"}]),
    (("podTemplate", "volumes"), [{"emptyDir": {}}]),
    (("podTemplate", "volumes"), [{"name": "v" * 64, "emptyDir": {}}]),
    (("podTemplate", "volumes"), [{"name": "h", "hostPath": {"path": "/"}}]),
    (("podTemplate", "volumes"), [{"name": "h", "hostPath": {}}]),
    (("podTemplate", "volumeMounts"), ["not-an-object"]),
    (("checkpoint", "fsx"), {"fileSystemId": "fs-123", "dnsName": "a", "mountName": "m"}),
    (("checkpoint", "fsx"), {"fileSystemId": "fs-0123456789abcdef0", "dnsName": "A.b", "mountName": "m"}),
    (("checkpoint", "fsx"), {"fileSystemId": "fs-0123456789abcdef0", "dnsName": "a", "mountName": "a" * 17}),
    (("checkpoint", "fsx"), {"fileSystemId": "fs-0123456789abcdef0", "dnsName": "a"}),
    (("resources", "cpu"), "BAD"),
    (
        ("checkpoint", "fsx"),
        {"fileSystemId": "fs-01234567", "dnsName": "a", "mountName": "m", "storageCapacity": "0"},
    ),
    (
        ("checkpoint", "fsx"),
        {"fileSystemId": "fs-01234567", "dnsName": "a", "mountName": "m", "storageCapacity": 0},
    ),
    (
        ("checkpoint", "fsx"),
        {"fileSystemId": "fs-01234567", "dnsName": "a", "mountName": "m", "storageCapacity": "0.0Gi"},
    ),
]
WRONG_TYPES = st.sampled_from([None, "7", 7, 7.5, 7.0, True, False, [], {}, ["x"], {"a": 1}, "", -1, 2**64])
TYPE_PATHS = (
    [p for p, _, _ in INT_BOUNDS]
    + [p for p, _, _ in STR_BOUNDS]
    + [
        ("suspend",),
        ("command",),
        ("args",),
        ("env",),
        ("resources", "cpu"),
        ("resources", "memory"),
        ("faultTolerance", "quarantineFaultyNodes"),
        ("faultTolerance", "doNotRestartExitCodes"),
        ("faultTolerance", "inProcessRestart", "enabled"),
        ("placement", "nodeSelector"),
        ("placement", "tolerations"),
        ("placement", "affinity"),
        ("podTemplate", "labels"),
        ("podTemplate", "annotations"),
        ("podTemplate", "volumes"),
        ("checkpoint",),
        ("faultTolerance",),
    ]
)
UNKNOWN_AT = [
    (),
    ("faultTolerance",),
    ("faultTolerance", "inProcessRestart"),
    ("checkpoint",),
    ("placement",),
    ("podTemplate",),
    ("resources",),
]
UNKNOWN_NAMES = ["gpus", "hostNetwork", "hostPID", "hostIPC", "privileged", "securityContext", "Nodes", "x"]


def _set(spec: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = spec
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


def _get(spec: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = spec
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


MUTATION_KINDS = ["int", "str", "pattern", "type", "unknown", "cel", "ckpt", "drop", "quantity"]


Mutation = Callable[[dict[str, Any]], None]


def _setter(path: tuple[str, ...], value: Any) -> Mutation:
    return lambda spec: _set(spec, path, copy.deepcopy(value))


def _setter_many(*items: tuple[tuple[str, ...], Any]) -> Mutation:
    def apply(spec: dict[str, Any]) -> None:
        for path, value in items:
            _set(spec, path, copy.deepcopy(value))

    return apply


def _dropper(key: str) -> Mutation:
    return lambda spec: spec.pop(key, None)


@st.composite
def mutation(draw: st.DrawFn) -> Mutation:
    """One boundary mutation, as a function applied to a copy of a valid spec."""
    kind = draw(st.sampled_from(MUTATION_KINDS))
    if kind == "int":
        path, lo, hi = draw(st.sampled_from(INT_BOUNDS))
        return _setter(path, draw(st.sampled_from([lo - 1, hi + 1, lo, hi, -(2**63), 2**63 - 1])))
    if kind == "str":
        path, hi, lo = draw(st.sampled_from(STR_BOUNDS))
        n = draw(st.sampled_from([hi + 1, max(lo - 1, 0), hi]))
        value = ("/" + "a" * (n - 1) if n else "") if path[-1] == "mountPath" else "a" * n
        return _setter(path, value)
    if kind == "pattern":
        return _setter(*draw(st.sampled_from(PATTERN_BREAKS)))
    if kind == "type":
        return _setter(draw(st.sampled_from(TYPE_PATHS)), draw(WRONG_TYPES))
    if kind == "unknown":
        path = draw(st.sampled_from(UNKNOWN_AT))
        return _setter((*path, draw(st.sampled_from(UNKNOWN_NAMES))), draw(st.sampled_from([True, 1, "x"])))
    if kind == "cel":
        rule = draw(st.sampled_from(["hb", "startup", "soft", "procs"]))
        d = draw(st.sampled_from([-1, 0, 1]))
        ft, ip = ("faultTolerance",), ("faultTolerance", "inProcessRestart")
        if rule == "hb":
            v = draw(ints(2, 300))
            return _setter_many(
                ((*ft, "heartbeatIntervalSeconds"), v), ((*ft, "heartbeatTimeoutSeconds"), v + d)
            )
        if rule == "startup":
            v = draw(ints(3, 3600))
            return _setter_many(
                ((*ft, "heartbeatTimeoutSeconds"), v), ((*ft, "startupTimeoutSeconds"), v + d)
            )
        if rule == "soft":
            v = draw(ints(2, 86399))
            return _setter_many(((*ip, "softTimeoutSeconds"), v), ((*ip, "hardTimeoutSeconds"), v + d))
        g = draw(ints(0, 8))
        return _setter_many((("gpusPerNode",), g), (("procsPerNode",), max(1, g + d)))
    if kind == "ckpt":
        fsx = {"fileSystemId": "fs-0123456789abcdef0", "dnsName": "a.b", "mountName": "m"}
        options = [{}, {"pvc": {"claimName": "c"}, "fsx": fsx}, {"keep": 2}, {"pvc": {}}, {"fsx": fsx}]
        return _setter(("checkpoint",), draw(st.sampled_from(options)))
    if kind == "drop":
        return _dropper(draw(st.sampled_from(["image", "command", "nodes", "checkpoint"])))
    key = draw(st.sampled_from(["cpu", "memory", "sharedMemorySize"]))
    return _setter(("resources", key), draw(BAD_QUANTITY))


@st.composite
def valid_tweak(draw: st.DrawFn) -> Mutation:
    """A change that stays in range (an integer or a length at its bound, a cross-field pair that
    holds); it can still break a cross-field rule together with the rest of the spec."""
    kind = draw(st.sampled_from(["int", "str", "cel"]))
    if kind == "int":
        path, lo, hi = draw(st.sampled_from(INT_BOUNDS))
        return _setter(path, draw(st.one_of(st.sampled_from([lo, hi]), st.integers(lo, hi))))
    if kind == "str":
        path, hi, lo = draw(st.sampled_from(STR_BOUNDS))
        n = draw(st.sampled_from([hi, max(lo, 1)]))
        return _setter(path, "/" + "a" * (n - 1) if path[-1] == "mountPath" else "a" * n)
    ft, ip = ("faultTolerance",), ("faultTolerance", "inProcessRestart")
    rule = draw(st.sampled_from(["hb", "soft", "procs"]))
    if rule == "hb":
        v = draw(ints(1, 299))
        return _setter_many(
            ((*ft, "heartbeatIntervalSeconds"), v),
            ((*ft, "heartbeatTimeoutSeconds"), v + 1),
            ((*ft, "startupTimeoutSeconds"), v + 1),
        )
    if rule == "soft":
        v = draw(ints(1, 86399))
        return _setter_many(((*ip, "softTimeoutSeconds"), v), ((*ip, "hardTimeoutSeconds"), v + 1))
    g = draw(ints(1, 8))
    return _setter_many((("gpusPerNode",), g), (("procsPerNode",), g))


@st.composite
def spec_family(draw: st.DrawFn, size: int = 32) -> list[dict[str, Any]]:
    """`size` specs from one valid base: the base, then copies with one to three boundary mutations
    (half of them) or one to three in-range tweaks (the other half); the oracle decides validity.

    One base per family keeps hypothesis' per-choice cost low (a spec costs a few choices instead
    of ~90), which is what lets ten thousand specs fit in a couple of minutes."""
    base = draw(valid_spec())
    out = [base]
    for _ in range(size - 1):
        spec = copy.deepcopy(base)
        changes = mutation() if draw(st.booleans()) else valid_tweak()
        for m in draw(st.lists(changes, min_size=1, max_size=3)):
            m(spec)
        out.append(spec)
    return out


@st.composite
def job_specs(draw: st.DrawFn) -> dict[str, Any]:
    """One spec: valid half the time, else one to three boundary mutations of a valid spec."""
    spec = draw(valid_spec())
    if draw(st.booleans()):
        for m in draw(st.lists(mutation(), min_size=1, max_size=3)):
            m(spec)
    return spec


def manifest(name: str, spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": contract.KIND, "metadata": {"name": name}, "spec": spec}


# --- the oracle -----------------------------------------------------------------------------------------
def prune_nulls(value: Any) -> Any:
    """What the API server validates: nulls of (non-nullable) object fields dropped, and JSON
    numbers with no fractional part (7.0) taken as integers, as OpenAPI's `integer` does (pydantic's
    strict mode would refuse 7.0; the operator parses in lax mode and reads 7)."""
    if isinstance(value, dict):
        return {k: prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [prune_nulls(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def cross_field_violations(spec: JobSpec) -> list[str]:
    """The CRD's CEL rules, evaluated on the defaulted model (the API server evaluates the defaulted
    object)."""
    out = []
    ft, ip = spec.fault_tolerance, spec.fault_tolerance.in_process_restart
    if (
        spec.procs_per_node is not None
        and spec.gpus_per_node != 0
        and spec.procs_per_node > spec.gpus_per_node
    ):
        out.append("spec.procsPerNode")
    if not ft.heartbeat_timeout_seconds > ft.heartbeat_interval_seconds:
        out.append("spec.faultTolerance.heartbeatTimeoutSeconds")
    if not ft.startup_timeout_seconds >= ft.heartbeat_timeout_seconds:
        out.append("spec.faultTolerance.startupTimeoutSeconds")
    if not ip.hard_timeout_seconds > ip.soft_timeout_seconds:
        out.append("spec.faultTolerance.inProcessRestart.hardTimeoutSeconds")
    if (spec.checkpoint.pvc is None) == (spec.checkpoint.fsx is None):
        out.append("spec.checkpoint")
    for i, vol in enumerate(spec.pod_template.volumes):
        if "hostPath" in vol:
            out.append(f"spec.podTemplate.volumes[{i}]")
    for i, tol in enumerate(spec.placement.tolerations):
        if (
            (tol.key == "" and tol.operator != "Exists")
            or (tol.operator == "Exists" and tol.value != "")
            or (tol.toleration_seconds is not None and tol.effect != "NoExecute")
            or (tol.key != "" and qualified_name_error(tol.key))
        ):
            out.append(f"spec.placement.tolerations[{i}]")
    if spec.checkpoint.mount_path == SHM_MOUNT_PATH:
        out.append("spec.checkpoint.mountPath")
    volumes = {*RESERVED_VOLUMES, *(v["name"] for v in spec.pod_template.volumes)}
    for i, mount in enumerate(spec.pod_template.volume_mounts):
        if mount["name"] not in volumes or mount["mountPath"] in (SHM_MOUNT_PATH, spec.checkpoint.mount_path):
            out.append(f"spec.podTemplate.volumeMounts[{i}]")
    return out


def _integral_float(spec: dict[str, Any], path: str) -> bool:
    value: Any = spec
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return isinstance(value, float)


def cel_type_errors(spec: dict[str, Any], model: JobSpec) -> list[str]:
    """Rules the API server cannot evaluate: its CEL adapter takes an `integer` field only as a JSON
    integer, so an integral float (7.0) that schema validation accepted fails every rule that reads
    it ("invalid data, expected int, got float64"; kubernetes-sigs/kro#1303 is the same adapter).
    CEL's `||` still yields true when another operand is true, whatever the erroring one."""
    out = []
    for rule, fields in (
        (
            "spec.faultTolerance.heartbeatTimeoutSeconds",
            ("heartbeatTimeoutSeconds", "heartbeatIntervalSeconds"),
        ),
        ("spec.faultTolerance.startupTimeoutSeconds", ("startupTimeoutSeconds", "heartbeatTimeoutSeconds")),
    ):
        if any(_integral_float(spec, f"faultTolerance.{f}") for f in fields):
            out.append(rule)
    if any(
        _integral_float(spec, f"faultTolerance.inProcessRestart.{f}")
        for f in ("hardTimeoutSeconds", "softTimeoutSeconds")
    ):
        out.append("spec.faultTolerance.inProcessRestart.hardTimeoutSeconds")
    # !has(self.procsPerNode) || self.procsPerNode <= self.gpusPerNode || self.gpusPerNode == 0
    if model.procs_per_node is not None:
        procs_f, gpus_f = _integral_float(spec, "procsPerNode"), _integral_float(spec, "gpusPerNode")
        fits = not (procs_f or gpus_f) and model.procs_per_node <= model.gpus_per_node
        no_gpus = not gpus_f and model.gpus_per_node == 0
        if (procs_f or gpus_f) and not (fits or no_gpus):
            out.append("spec.procsPerNode")
    return out


def oracle(spec: Any) -> tuple[bool, str]:
    """(valid, why not) for a spec as sent to the API server."""
    if not isinstance(spec, dict):
        return False, "spec must be an object"
    try:
        model = JobSpec.model_validate(prune_nulls(spec), strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        return False, "spec." + ".".join(str(p) for p in err["loc"]) + ": " + err["msg"]
    violations = cross_field_violations(model) + cel_type_errors(spec, model)
    return (not violations), "; ".join(violations)
