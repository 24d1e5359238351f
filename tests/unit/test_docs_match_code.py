"""Issue 16, points 12 and 13: what the docs state about the pods and the chart is what the code builds
and the chart renders (the trainer ServiceAccount's verbs, the rendezvous pod's resources, the trainer
image's user), one figure is given once (`make demo`'s time), no docstring points outside the repo, and
the image build context lets in exactly what the Dockerfiles copy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ladder_testkit import make_job
from rtj import builders
from rtj.api import crdgen, models
from test_chart_render import one, render

pytestmark = pytest.mark.unit

ROOT = crdgen.REPO_ROOT
TRAINER_README = (ROOT / "trainer-image" / "README.md").read_text()
CHART_README = (ROOT / "charts" / "resilient-training-operator" / "README.md").read_text()
README = (ROOT / "README.md").read_text()


def flat(text: str) -> str:
    """Markdown with its line breaks folded, so a phrase may wrap."""
    return re.sub(r"\s+", " ", text)


def test_trainer_service_account_verbs_in_the_docs_are_the_charts() -> None:
    (rule,) = one(render("trainer.namespaces={ml-a}"), "ClusterRole", "-trainer")["rules"]
    verbs = ", ".join(rule["verbs"])
    assert f"allowed to `{verbs}` `coordination.k8s.io` `leases`" in flat(TRAINER_README)
    assert f"may only {' and '.join(rule['verbs'])} Leases" in flat(CHART_README)


def test_rendezvous_pod_resources_in_the_docs_are_the_builders() -> None:
    (container,) = builders.rendezvous_pod(make_job().obj())["spec"]["containers"]
    req, lim = container["resources"]["requests"], container["resources"]["limits"]
    stated = f"requests {req['cpu']} CPU and {req['memory']}, limits {lim['cpu']} CPU and {lim['memory']}"
    assert stated in flat(TRAINER_README)


def test_trainer_image_user_is_the_default_fs_group_and_the_docs_say_so() -> None:
    user = re.search(r"^USER (\d+):(\d+)$", (ROOT / "trainer-image" / "Dockerfile").read_text(), re.M)
    assert user, "the trainer Dockerfile must name a numeric USER uid:gid"
    uid, gid = int(user[1]), int(user[2])
    assert gid == models.TRAINER_IMAGE_GID  # the default fsGroup makes the checkpoint volume the image's
    for doc in (flat(TRAINER_README), flat(CHART_README)):
        assert f"USER {uid}" in doc or f"UID {uid}" in doc
        assert not re.search(r"(USER|UID|fsGroup) 1000\b", doc), "a stale UID/GID 1000"


def test_make_demo_time_is_stated_once() -> None:
    times = set(re.findall(r"`make demo` takes about ([\d.]+) minutes", flat(README)))
    times |= set(re.findall(r"in about ([\d.]+) minutes once the binaries are cached", flat(README)))
    assert len(times) == 1, times


def test_no_docstring_or_doc_names_a_path_outside_the_repo() -> None:
    sources = [*ROOT.glob("operator/rtj/**/*.py"), *ROOT.glob("trainer-image/rtj_trainer/**/*.py")]
    docs = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("*/**/README.md")]
    for path in sources + docs:
        if ".venv" in path.parts:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not re.search(r"(?<![\w.~])/(work|home|root)/", line), f"{path}:{n}: {line.strip()}"


def _copied_sources(dockerfile: Path) -> set[str]:
    """What the Dockerfile's COPY instructions take from the build context (not `--from=` stages)."""
    copied = set()
    for line in dockerfile.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not any(p.startswith("--from=") for p in parts):
            copied |= {p for p in parts[1:-1] if not p.startswith("--")}
    return copied


def test_build_context_admits_exactly_what_the_dockerfiles_copy() -> None:
    admitted = {
        line[1:].removesuffix("/**").removesuffix("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert "**" in (ROOT / ".dockerignore").read_text().splitlines()  # everything else stays out
    copied = _copied_sources(ROOT / "Dockerfile") | _copied_sources(ROOT / "trainer-image" / "Dockerfile")
    copied = {c.rstrip("/") for c in copied}
    for source in copied:
        inside = (source == a or source.startswith(a + "/") or a.startswith(source + "/") for a in admitted)
        assert any(inside), f"COPY {source} is not in .dockerignore's allow list"
    for a in admitted:
        assert any(a == c or a.startswith(c + "/") for c in copied), f".dockerignore admits unused {a}"
