"""README command 1 on a plain install: a wheel in a fresh venv that holds only the runtime dependencies.

The venv has no system site-packages; the runtime dependencies (and theirs, from the wheel's own
`Requires-Dist`) are linked into one folder on its path, so anything else — the `openai` SDK, the
test tools — is absent, as on a new user's machine. Nothing is downloaded.
"""

from __future__ import annotations

import email
import importlib.metadata
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import aiohttp
import pytest
from packaging.requirements import Requirement

from tests.harness import listening_port

REPO = Path(__file__).resolve().parent.parent


def _runtime_closure(requirements: list[str]) -> set[str]:
    """Distribution names the requirements need, transitively, on this interpreter (extras not asked for)."""
    todo, seen = list(requirements), set()
    while todo:
        requirement = Requirement(todo.pop())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = requirement.name.lower()
        if name not in seen:
            seen.add(name)
            todo += importlib.metadata.distribution(name).requires or []
    return seen


def _link_distributions(names: set[str], folder: Path) -> None:
    """Link each distribution's top-level files and folders (its dist-info too) into `folder`."""
    folder.mkdir()
    for name in names:
        dist = importlib.metadata.distribution(name)
        site = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            target = folder / top
            if top != "__pycache__" and (site / top).exists() and not target.exists():
                target.symlink_to(site / top)


@pytest.fixture(scope="module")
def plain_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `bin/` of a venv with the context-proxy wheel (installed --no-deps) and only its runtime dependencies."""
    root = tmp_path_factory.mktemp("plain-install")
    run = {"check": True, "capture_output": True, "timeout": 120, "env": _clean_env()}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", root, REPO],
        cwd=root,
        **run,
    )
    wheel = next(root.glob("context_proxy-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = email.message_from_bytes(archive.read(metadata)).get_all("Requires-Dist") or []
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], **run)
    python = root / "venv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel], **run)
    _link_distributions(_runtime_closure(requires), root / "runtime")
    site = Path(
        subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], **run, text=True).stdout.strip()
    )
    (site / "runtime-deps.pth").write_text(str(root / "runtime") + "\n")
    return root / "venv" / "bin"


def _clean_env() -> dict[str, str]:
    """This process's environment without what points at the repo; wide enough that help lines do not wrap."""
    return {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}, "COLUMNS": "400"}


def _run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = _clean_env()
    return subprocess.run([bin_dir / args[0], *args[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_plain_install_holds_no_test_or_sdk_packages(plain_install: Path, tmp_path: Path) -> None:
    probe = "import importlib.util as u; print([m for m in ('openai', 'pytest', 'proxy') if u.find_spec(m)])"
    assert _run(plain_install, "python", "-c", probe, cwd=tmp_path).stdout.strip() == "['proxy']"


def test_readme_command_one_runs_the_demo_on_a_plain_install(plain_install: Path, tmp_path: Path) -> None:
    done = _run(plain_install, "context-proxy", "demo", "--turns", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "turns sent" in done.stdout and "X-Context-Tokens-After:" in done.stdout


async def test_a_plain_install_serves_from_any_folder_with_its_packaged_config(
    plain_install: Path, tmp_path: Path
) -> None:
    env = _clean_env()
    process = subprocess.Popen(
        [plain_install / "context-proxy", "serve", "--port", "0"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = listening_port(process)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                assert response.status == 200
            for path in ("/dashboard", "/dashboard/dashboard.js", "/dashboard/dashboard.css"):  # the wheel holds them
                async with http.get(f"http://127.0.0.1:{port}{path}") as response:
                    assert response.status == 200 and len(await response.read()) > 1000, path
    finally:
        process.terminate()
        process.wait(timeout=10)
    help_text = _run(plain_install, "context-proxy", "serve", "--help", cwd=tmp_path).stdout
    packaged = help_text.split("default: the packaged ", 1)[1].split(")")[0]
    assert Path(packaged).is_file() and str(plain_install.parent) in packaged
