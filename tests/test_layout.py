"""The package's layout rules, checked on its source: one home for each idea.

* ``core`` imports nothing else of tinyflash: it is the bottom layer, the rules of the mathematics.
* ``gpu`` imports nothing of ``core``, ``forward`` or ``measure``: a runtime, no attention math.
* a kernel version imports ``core``, ``gpu`` and its folder's tiling modules (``tiling.py`` for v2 to v5,
  ``tensor_core_tiling.py`` for v6), never a sibling version.
* teaching code (``core``, ``forward``) never imports the tooling in ``measure``.
* no source file is much over 450 lines, and no kernel body reaches 100.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "tinyflash"
KERNELS = PACKAGE / "forward" / "kernels"
MAX_FILE_LINES = 460
MAX_KERNEL_LINES = 100


def tinyflash_imports(path: Path) -> set[str]:
    """What a file imports from tinyflash, as dotted names below the package ('core.masks.key_stop')."""
    package = path.relative_to(PACKAGE).parent.parts  # e.g. ('forward', 'kernels')
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module.split(".") if node.module else []
            if node.level:  # from ..core.masks import key_stop: level 1 is this file's package
                target = [*package[:len(package) - node.level + 1], *module]
            elif module[:1] == ["tinyflash"]:
                target = module[1:]
            else:
                continue
            found |= {".".join([*target, alias.name]) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("tinyflash.")}
    return found


def sources(folder: Path):
    return sorted(p for p in folder.rglob("*.py"))


@pytest.mark.parametrize("path", sources(PACKAGE / "core"), ids=lambda p: p.name)
def test_core_is_the_bottom_layer(path):
    assert all(m.startswith("core") for m in tinyflash_imports(path)), tinyflash_imports(path)


@pytest.mark.parametrize("path", sources(PACKAGE / "gpu"), ids=lambda p: p.name)
def test_gpu_is_runtime_only(path):
    assert all(m.startswith(("gpu", "hardware")) for m in tinyflash_imports(path)), tinyflash_imports(path)


@pytest.mark.parametrize("path", sorted(KERNELS.glob("v[0-9]*_*.py")), ids=lambda p: p.name)
def test_a_kernel_version_never_imports_a_sibling(path):
    allowed = ("core.", "gpu.", "hardware.", "forward.kernels.tiling.", "forward.kernels.tensor_core_tiling.")
    imports = tinyflash_imports(path)
    assert imports and all(m.startswith(allowed) for m in imports), imports


@pytest.mark.parametrize("path", sources(PACKAGE / "core") + sources(PACKAGE / "forward"), ids=lambda p: p.name)
def test_teaching_code_does_not_import_the_tooling(path):
    assert not any(m.startswith("measure") for m in tinyflash_imports(path)), tinyflash_imports(path)


@pytest.mark.parametrize("path", sources(PACKAGE), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_file_is_too_long(path):
    assert len(path.read_text().splitlines()) <= MAX_FILE_LINES


@pytest.mark.parametrize("path", sorted(KERNELS.glob("v[0-9]*_*.py")), ids=lambda p: p.name)
def test_kernel_bodies_are_short(path):
    """Every function decorated with ``@cuda.jit`` or ``@cuda.jit(...)`` without device=True (a kernel)."""
    kernels = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
               and any(ast.unparse(d) == "cuda.jit" or ast.unparse(d).startswith("cuda.jit(")
                       and "device=True" not in ast.unparse(d) for d in node.decorator_list)]
    assert kernels
    for fn in kernels:
        assert fn.end_lineno - fn.lineno + 1 < MAX_KERNEL_LINES, (fn.name, fn.end_lineno - fn.lineno + 1)


def test_the_import_rule_checker_sees_relative_imports():
    """The checker itself: v5 imports core, gpu and tiling, through relative imports."""
    imports = tinyflash_imports(KERNELS / "v5_branch_free.py")
    assert {"core.masks.key_stop", "gpu.smem.shared_floats", "forward.kernels.tiling.TileConfig"} <= imports


def test_every_registered_version_has_its_file():
    from tinyflash.forward.kernels import VERSIONS

    assert sorted(v.module for v in VERSIONS.values()) == sorted(p.name for p in KERNELS.glob("v[0-9]*_*.py"))
