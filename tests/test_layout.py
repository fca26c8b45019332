"""robotrl's layout (DESIGN.md): subpackages in layers whose imports point down only, as the import-linter contracts
in pyproject.toml state them and `lint-imports` checks them; nothing left at robotrl's top level but the package
and the CLI; every package in the wheel."""

from __future__ import annotations

import runpy
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: robotrl.policies modules the robot side may import: the runtime, its language encoder, the torch-free helpers
HARDWARE_MAY_IMPORT = {"runtime", "language", "controller", "timing"}
#: scripts/lint_imports.py: robotrl laid out as installed (`lay_out`), from pyproject's package-dir (`package_dirs`)
LINT = runpy.run_path(str(ROOT / "scripts" / "lint_imports.py"))


def package_dirs() -> dict[str, Path]:
    return LINT["package_dirs"](ROOT)


def folder_of(package: str) -> Path:
    """Where a package of the wheel comes from: its nearest mapped ancestor's folder, and the rest of its name."""
    dirs = package_dirs()
    base = max((name for name in dirs if package == name or package.startswith(name + ".")), key=len)
    return dirs[base].joinpath(*package[len(base) :].split(".")[1:])


def lint_imports(view: Path) -> subprocess.CompletedProcess[str]:
    """The venv's `lint-imports` with pyproject.toml's contracts, on the robotrl laid out in `view`."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=view,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_contracts_hold(tmp_path: Path) -> None:
    """On robotrl as installed (scripts/lint_imports.py: envs/, policies/, datasets/ and hardware/ inside it)."""
    out = lint_imports(LINT["lay_out"](tmp_path))
    contracts = PYPROJECT["tool"]["importlinter"]["contracts"]
    assert out.returncode == 0 and f"Contracts: {len(contracts)} kept, 0 broken." in out.stdout, out.stdout + out.stderr


def test_a_learner_imported_in_a_mapped_folder_breaks_its_contracts(tmp_path: Path) -> None:
    """The folders package-dir maps into robotrl are in the graph: an env module that imports a learner is caught."""
    view = LINT["lay_out"](tmp_path)
    envs = view / "robotrl" / "envs"
    envs.unlink()
    envs.mkdir()
    for entry in folder_of("robotrl.envs").iterdir():
        (envs / entry.name).symlink_to(entry)
    (envs / "leak.py").write_text("from robotrl.rl.sac import SacConfig\n")
    out = lint_imports(view)
    assert out.returncode == 1 and "robotrl.envs is not allowed to import robotrl.rl" in out.stdout, out.stdout


def test_robotrl_top_level_holds_only_the_package_and_the_cli() -> None:
    """Every other module lives in the subpackage of its layer (core, training, rl, flowrl, stages)."""
    assert sorted(p.name for p in (ROOT / "robotrl").glob("*.py")) == ["__init__.py", "cli.py"]


def test_every_package_and_its_data_is_in_the_wheel() -> None:
    setuptools = PYPROJECT["tool"]["setuptools"]
    found = {
        name + "".join(f".{part}" for part in init.parent.relative_to(folder).parts)
        for name, folder in package_dirs().items()
        for init in folder.rglob("__init__.py")
    }
    assert sorted(setuptools["packages"]) == sorted(found)
    for package, patterns in setuptools["package-data"].items():
        for pattern in patterns:
            assert list(folder_of(package).glob(pattern)), f"package-data {package}: {pattern!r} matches no file"


def test_the_hardware_contract_forbids_every_torch_policy_module() -> None:
    """A new module of robotrl.policies is forbidden to the robot side until it is named here as allowed."""
    contract = next(c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["id"] == "hardware")
    forbidden = {
        m.removeprefix("robotrl.policies.") for m in contract["forbidden_modules"] if m.startswith("robotrl.policies.")
    }
    modules = {p.stem for p in folder_of("robotrl.policies").glob("*.py")} - {"__init__"}
    assert forbidden == modules - HARDWARE_MAY_IMPORT


def test_nothing_the_package_reads_back_is_pickled() -> None:
    """One checkpoint format (safetensors + JSON manifest): no module imports pickle, numpy never loads with
    `allow_pickle=True`, nothing calls `torch.save` (train states are safetensors too: robotrl/training/state_file.py),
    and the one `torch.load`, with `weights_only=True`, is `policy convert`'s of an earlier robotrl's actor.pt."""
    import ast

    saves, loads, problems = [], [], []
    for folder in sorted(set(package_dirs().values())):
        for file in sorted(folder.rglob("*.py")):
            tree = ast.parse(file.read_text())
            for node in ast.walk(tree):
                where = f"{file.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                    if any(n and n.split(".")[0] in ("pickle", "cloudpickle", "dill") for n in names):
                        problems.append(f"{where}: imports pickle")
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
                keywords = {k.arg: k.value for k in node.keywords}
                if (owner, node.func.attr) == ("torch", "save"):
                    saves.append(where)
                if (owner, node.func.attr) == ("torch", "load"):
                    loads.append(where)
                    if not (
                        isinstance(keywords.get("weights_only"), ast.Constant)
                        and keywords["weights_only"].value is True
                    ):
                        problems.append(f"{where}: torch.load without weights_only=True")
                if isinstance(keywords.get("allow_pickle"), ast.Constant) and keywords["allow_pickle"].value is True:
                    problems.append(f"{where}: allow_pickle=True")
    assert problems == []
    assert saves == []
    assert [s.rsplit(":", 1)[0] for s in loads] == ["robotrl/rl/convert.py"], loads
