"""Container runtimes: the engine's command lines (only the leased GPUs, non-root, no
capabilities, no socket), and a real run in a locally built image where an engine can run one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from contract.config import Batch, Config, Runtime
from tests.missing_tools import skip_missing
from workers import containers
from workers.containers import ContainerHost, ContainerRun
from workers.envs import inspect_python
from workers.runner import RunRequest, run_batch

BOX = Path("/var/lib/gpuci/runs/run-1-abc/box")
RUN = ContainerRun(
    name="gpuci-run-1-abc",
    image="pytorch/pytorch:2.13.0-cuda13.0",
    box=BOX,
    user="1001:1001",
    gpu_indices=(1, 3),
    writable=(Path("/var/cache/gpuci/acme__gpu/torch/packages"),),
    read_only=(Path("/var/cache/gpuci/acme__gpu/torch/huggingface"),),
)


def test_the_container_gets_only_its_gpus_box_and_caches_and_no_privilege() -> None:
    args = containers.start_command(ContainerHost("podman"), RUN)

    assert args[:3] == ["podman", "run", "--detach"]
    assert args[args.index("--user") : args.index("--user") + 2] == ["--user", "1001:1001"]
    assert "--cap-drop=ALL" in args and "--security-opt=no-new-privileges" in args
    assert "--privileged" not in args
    assert not any(".sock" in a for a in args)  # no engine socket
    volumes = [args[i + 1] for i, a in enumerate(args) if a == "--volume"]
    assert volumes == [
        f"{BOX}:{BOX}",
        "/var/cache/gpuci/acme__gpu/torch/packages:/var/cache/gpuci/acme__gpu/torch/packages",
        "/var/cache/gpuci/acme__gpu/torch/huggingface:/var/cache/gpuci/acme__gpu/torch/huggingface"
        ":ro",
    ]
    devices = [args[i + 1] for i, a in enumerate(args) if a == "--device"]
    assert devices == ["nvidia.com/gpu=1", "nvidia.com/gpu=3"]
    assert args[-4:] == ["--entrypoint", "sleep", "pytorch/pytorch:2.13.0-cuda13.0", "infinity"]


def test_docker_style_gpus_and_no_network() -> None:
    args = containers.start_command(ContainerHost("docker", "gpus"), replace(RUN, network=False))

    assert args[args.index("--gpus") + 1] == '"device=1,3"'
    assert args[args.index("--network") + 1] == "none"
    assert "--device" not in args


def test_a_cpu_batch_gets_no_gpu() -> None:
    args = containers.start_command(ContainerHost("podman"), replace(RUN, gpu_indices=()))

    assert "--device" not in args and "--gpus" not in args


def test_steps_name_variables_without_their_values() -> None:
    args = containers.exec_command(
        ContainerHost("docker"), RUN, ["python", "-m", "pytest"], BOX / "src", {"HF_TOKEN": "x"}
    )

    assert args == [
        "docker", "exec", "--user", "1001:1001", "--workdir", f"{BOX}/src",
        "--env", "HF_TOKEN", "gpuci-run-1-abc", "python", "-m", "pytest",
    ]  # fmt: skip
    assert "x" not in args


# --- a real engine -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> tuple[ContainerHost, str]:
    """An engine that runs containers here, and a test image built locally (no registry): an
    empty image that sees the host's Python read-only, as a host's own image would carry it."""
    found = next((e for e in ("podman", "docker") if shutil.which(e)), None)
    if found is None:
        skip_missing("no container engine: apt-get install -y podman (or docker)")
    context = tmp_path_factory.mktemp("image")
    (context / "gpuci-test-image").write_text("1\n")
    (context / "Containerfile").write_text("FROM scratch\nCOPY gpuci-test-image /\n")
    image = "localhost/gpuci-test:latest"
    built = subprocess.run(
        [found, "build", "-t", image, "-f", str(context / "Containerfile"), str(context)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    layout = inspect_python(sys.executable)
    shown = ["/usr", "/bin", "/lib", "/lib64", "/etc", *map(str, layout.visible_paths())]
    host = ContainerHost(found, read_only=tuple(p for p in shown if Path(p).exists()))
    why = built.stderr.strip()[-300:] if built.returncode else containers.usable(host, image)
    if why:
        skip_missing(f"{found} cannot run containers on this machine ({why})")
    return host, image


def test_a_run_in_a_container_reports_its_digest_and_leaves_no_container(
    tmp_path: Path, engine: tuple[ContainerHost, str]
) -> None:
    host, image = engine
    (tmp_path / "src" / "tests").mkdir(parents=True)
    (tmp_path / "src" / "tests" / "test_in.py").write_text(
        "import os\n\ndef test_inside():\n    assert os.path.exists('/gpuci-test-image')\n"
        "    assert os.getuid() != 0\n"
    )
    runtime = Runtime("image", image=image)
    batch = Batch(name="c", gpus=0, tests=("tests",), timeout_s=120)
    config = Config(
        version=1, batches={"c": batch}, runtimes={"image": runtime}, default_runtime="image",
        env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )  # fmt: skip
    request = RunRequest(
        run_id="c-1", batch=batch, config=config, source=tmp_path / "src", gpu_indices=(),
        work_root=tmp_path / "work", load_report_plugin=False, container=host,
    )  # fmt: skip

    outcome = run_batch(request)

    assert outcome.junit_path is not None, outcome.log_tail
    assert 'failures="0"' in outcome.junit_path.read_text()
    assert outcome.runtime["digest"].startswith("sha256:")
    left = subprocess.run(
        [host.engine, "ps", "--all", "--format", "{{.Names}}"], capture_output=True, text=True
    ).stdout
    assert f"gpuci-{outcome.workdir.name}" not in left
