"""The repository's layout rules, checked on its source: one home for each idea, the book apart from the tooling.
docs/where-things-go.md writes the same rules out; each test here checks one of them, with no list of exceptions.

* ``core`` imports nothing else of tinyflash: it is the bottom layer, the rules of the mathematics;
  ``hardware`` imports nothing of tinyflash at all.
* ``gpu`` imports nothing but itself and ``hardware``: a runtime, no attention mathematics.
* ``host``, the host layer of every GPU entry point, imports ``core``, ``gpu``, ``hardware``, ``warp_tile`` and
  itself: never a stage; the public functions hand it their registry.
* the stages do not borrow each other's host code: ``forward``, ``backward`` and ``decode`` import nothing from
  one another.
* one module keeps call plans (``host/plans.py``), one type is a registry (``host/registry.py``), and only the
  folders' ``kernels/__init__.py`` make registries.
* a kernel version (``v<N>_*.py`` in forward/kernels and backward/kernels, the split kernels in decode/kernels)
  imports ``core``, ``gpu``, ``hardware``, ``warp_tile``, ``warpgroup_tile`` and its folder's shared modules, never
  a sibling version nor the host layer; in the package, the lessons, the benchmarks and the examples nothing but its
  folder's registry imports a kernel version's file: the rest reach a version through the registry
  (``VERSIONS[name]``: what it builds, how it is sized, its file's code). Tests may open any module: they check them.
* the book (every module but ``bench`` and ``plots``) never imports the tooling; lessons import the package and their
  helper (``lessons/lib.py``), never the tooling.
* the record is data: no test or lesson reads a log, no numbered run is kept, few logs at all.
* no file is over MAX_FILE_LINES lines; no function under src/ is over MAX_FUNCTION_LINES lines of code (nested
  functions counted in their parent); no kernel body reaches MAX_KERNEL_LINES.
* compiled code reads numbers, not Python objects: no ``@cuda.jit`` function reads an attribute of a
  tiling or spec (numba cannot type a dataclass or namespace; the simulator can, so only a GPU would see it).
* comments and docstrings say what the code does, not how fast it ran: a measurement lives in figures/data.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "tinyflash"
KERNEL_FOLDERS = {PACKAGE / "forward" / "kernels": "v[0-9]*_*.py", PACKAGE / "backward" / "kernels": "v[0-9]*_*.py",
                  PACKAGE / "decode" / "kernels": "*_cores.py"}
TOOLING = ("bench", "plots")
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 120  # lines of code: no blank line, comment or docstring; nested functions counted in their parent
MAX_KERNEL_LINES = 100
MAX_LOGS = 15


def tinyflash_imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """What a file imports from tinyflash, as dotted names below the package ('core.masks.key_stop')."""
    parts = path.relative_to(package).parent.parts if path.is_relative_to(package) else ()  # e.g. ('forward', 'kernels')
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module.split(".") if node.module else []
            if node.level:  # from ..core.masks import key_stop: level 1 is this file's package
                target = [*parts[:len(parts) - node.level + 1], *module]
            elif module[:1] == ["tinyflash"]:
                target = module[1:]
            else:
                continue
            found |= {".".join([*target, alias.name]) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".", 1)[1] if "." in a.name else "" for a in node.names
                      if a.name.split(".")[0] == "tinyflash"}
    return found


def sources(folder: Path):
    return sorted(p for p in folder.rglob("*.py"))


def kernel_versions() -> list[Path]:
    return sorted(p for folder, pattern in KERNEL_FOLDERS.items() for p in folder.glob(pattern))


def module_of(path: Path) -> str:
    """'forward.kernels.v6_tensor_cores' for src/tinyflash/forward/kernels/v6_tensor_cores.py."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


BOOK = [p for p in sources(PACKAGE) if p.relative_to(PACKAGE).parts[0] not in TOOLING]


@pytest.mark.parametrize("path", sources(PACKAGE / "core") + [PACKAGE / "hardware.py"], ids=lambda p: p.name)
def test_core_and_hardware_are_the_bottom_layer(path):
    allowed = () if path.name == "hardware.py" else ("core",)
    assert all(m.startswith(allowed) for m in tinyflash_imports(path)) if allowed else not tinyflash_imports(path)


@pytest.mark.parametrize("path", sources(PACKAGE / "gpu"), ids=lambda p: p.name)
def test_gpu_is_runtime_only(path):
    assert all(m.startswith(("gpu", "hardware")) for m in tinyflash_imports(path)), tinyflash_imports(path)


@pytest.mark.parametrize("path", sources(PACKAGE / "host"), ids=lambda p: p.name)
def test_the_host_layer_imports_no_stage(path):
    allowed = ("core.", "gpu.", "hardware.", "warp_tile.", "host.")
    imports = tinyflash_imports(path)
    assert all(m.startswith(allowed) for m in imports), sorted(m for m in imports if not m.startswith(allowed))


STAGES = ("forward", "backward", "decode")


@pytest.mark.parametrize("path", [p for stage in STAGES for p in sources(PACKAGE / stage)],
                         ids=lambda p: module_of(p))
def test_a_stage_imports_no_other_stage(path):
    """No stage borrows another's host code (or anything else): what they share is in core, gpu, host, warp_tile."""
    own = module_of(path).split(".")[0]
    others = tuple(f"{stage}." for stage in STAGES if stage != own)
    assert not [m for m in tinyflash_imports(path) if m.startswith(others)]


def test_one_module_keeps_plans_and_one_type_is_a_registry():
    """Call plans live in host/plans.py alone (no other module keeps a cache of them); the registry type is
    host/registry.py's, and only the kernel folders' __init__.py make registries of it."""
    for path in sources(PACKAGE):
        tree = ast.parse(path.read_text())
        names = {t.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
        classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        if path != PACKAGE / "host" / "plans.py":
            assert not {n for n in names if "PLANS" in n} and "PlanCache" not in classes, module_of(path)
        if path != PACKAGE / "host" / "registry.py":
            assert not {c for c in classes if c.endswith(("Version", "Kernel", "Registry"))} - {
                "DriverKernel", "HostOnlyKernel", "SplitKernel"}, (module_of(path), classes)
        makes = "Registry(" in path.read_text() and path.name == "__init__.py" and path.parent in KERNEL_FOLDERS
        assert makes or path.parent == PACKAGE / "host" or "Registry(" not in path.read_text(), module_of(path)


@pytest.mark.parametrize("path", kernel_versions(), ids=lambda p: module_of(p))
def test_a_kernel_version_never_imports_a_sibling(path):
    folder = module_of(path).rsplit(".", 1)[0]
    shared = [f"{folder}.{p.stem}." for p in path.parent.glob("*.py")
              if p not in kernel_versions() and p.name != "__init__.py"]
    allowed = ("core.", "gpu.", "hardware.", "warp_tile.", "warpgroup_tile.", *shared)
    imports = tinyflash_imports(path)
    assert imports and all(m.startswith(allowed) for m in imports), imports


READERS = [*sources(PACKAGE), *sorted((ROOT / "lessons").glob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py")),
           *sorted((ROOT / "examples").glob("*.py"))]


@pytest.mark.parametrize("path", READERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_a_registry_imports_a_kernel_version(path):
    """A kernel version is reached through its registry (``VERSIONS[name]``), from the package, the lessons, the
    benchmarks and the examples alike."""
    versions = {module_of(p) for p in kernel_versions()}
    registry = path.name == "__init__.py" and path.parent in KERNEL_FOLDERS
    reached = {v for v in versions for m in tinyflash_imports(path) if m == v or m.startswith(v + ".")
               or m == v.rsplit(".", 1)[0] + "." + v.rsplit(".", 1)[1]}
    folders = {module_of(p).rsplit(".", 1)[0] for p in kernel_versions()}
    reached |= {m for m in tinyflash_imports(path) if m.rsplit(".", 1)[0] in folders
                and f"{m.rsplit('.', 1)[0]}.{m.rsplit('.', 1)[1]}" in versions}  # from .kernels import v5_branch_free
    assert registry or not reached, reached


@pytest.mark.parametrize("path", BOOK, ids=lambda p: module_of(p))
def test_the_book_does_not_import_the_tooling(path):
    assert not any(m.startswith(TOOLING) for m in tinyflash_imports(path)), tinyflash_imports(path)


@pytest.mark.parametrize("path", sorted((ROOT / "lessons").glob("*.py")), ids=lambda p: p.name)
def test_lessons_import_the_package_and_their_helper(path):
    """A lesson imports tinyflash (the book) and lessons/lib.py; no tooling, no other file of the repository."""
    imports = tinyflash_imports(path)
    assert not any(m.startswith(TOOLING) for m in imports), imports
    local = {node.module for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and not node.level and node.module
             and node.module.split(".")[0] not in ("tinyflash", "numpy", "numba", "torch", "__future__")
             and node.module.split(".")[0] not in __import__("sys").stdlib_module_names}
    assert local <= {"lib"}, local


@pytest.mark.parametrize("path", sorted((ROOT / "tests").glob("*.py")) + sorted((ROOT / "lessons").glob("*.py")),
                         ids=lambda p: p.name)
def test_no_test_or_lesson_reads_a_log(path):
    """The record is figures/data/*.csv: a test or a lesson that names a '.log' file would be reading the lab notebook."""
    text = path.read_text()
    if path.name == "test_layout.py":
        text = text.replace('".log"', "").replace("'.log'", "")  # this rule's own words
    assert not re.search(r"\w\.log\b(?!\()", text), path.name  # a file name, not a logarithm call


def test_the_record_is_data_not_logs():
    """No numbered run (``_run3``) is kept; at most MAX_LOGS .log files in the repository (history is in git)."""
    files = [p for p in ROOT.rglob("*") if p.is_file() and not any(part.startswith(".") for part in
                                                                   p.relative_to(ROOT).parts)]
    assert not [p for p in files if re.search(r"_run\d", p.name)]
    assert len([p for p in files if p.suffix == ".log"]) <= MAX_LOGS


@pytest.mark.parametrize("path", sorted(p for p in ROOT.rglob("*.py") if not any(
    part.startswith(".") for part in p.relative_to(ROOT).parts)), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_is_too_long(path):
    assert len(path.read_text().splitlines()) <= MAX_FILE_LINES


def code_lines(source: str) -> set[int]:
    """The lines of ``source`` that hold code: not blank, not a comment, not a docstring."""
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER):
            lines.update(range(token.start[0], token.end[0] + 1))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value,
                                                                                                      str):
                lines -= set(range(first.lineno, first.end_lineno + 1))
    return lines


def function_lengths(source: str) -> dict[str, int]:
    """Lines of code of each outermost function (a method counts as one), its nested functions included."""
    code, found = code_lines(source), {}

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[f"{child.name}:{child.lineno}"] = len([n for n in code if child.lineno <= n <= child.end_lineno])
            else:
                visit(child)

    visit(ast.parse(source))
    return found


@pytest.mark.parametrize("path", sources(PACKAGE), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_too_long(path):
    """A reader holds a function whole: a kernel factory is split into named pieces (its device functions, made by
    functions of their own), not one closure of hundreds of lines."""
    long = {name: n for name, n in function_lengths(path.read_text()).items() if n > MAX_FUNCTION_LINES}
    assert not long, long


def test_the_function_length_counts_nested_functions_and_skips_prose():
    source = ('def f(a):\n    """Doc\n    string."""\n    # a comment\n\n    def g(b):\n        return b\n'
              '    return g(a)\n')
    assert function_lengths(source) == {"f:1": 4}


@pytest.mark.parametrize("path", kernel_versions(), ids=lambda p: module_of(p))
def test_kernel_bodies_are_short(path):
    """Every function decorated with ``@cuda.jit`` or ``@cuda.jit(...)`` without device=True (a kernel)."""
    kernels = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
               and any(ast.unparse(d) == "cuda.jit" or ast.unparse(d).startswith("cuda.jit(")
                       and "device=True" not in ast.unparse(d) for d in node.decorator_list)]
    assert kernels
    for fn in kernels:
        assert fn.end_lineno - fn.lineno + 1 < MAX_KERNEL_LINES, (fn.name, fn.end_lineno - fn.lineno + 1)


HOST_OBJECTS = {"spec", "cfg", "tile", "tiling", "prob", "self"}  # the names the kernel factories give them


def host_attribute_reads(source: str) -> list[str]:
    """``spec.S_TILES`` and the like inside any function decorated with ``cuda.jit`` (kernel or device)."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef) and any(ast.unparse(d).startswith("cuda.jit") for d in fn.decorator_list):
            found += [f"{fn.name}: {ast.unparse(node)}" for stmt in fn.body for node in ast.walk(stmt)
                      if isinstance(node, ast.Attribute)
                      and isinstance(node.value, ast.Name) and node.value.id in HOST_OBJECTS]
    return found


@pytest.mark.parametrize("path", [p for p in BOOK if "cuda.jit" in p.read_text()], ids=lambda p: module_of(p))
def test_compiled_code_reads_no_host_objects(path):
    assert host_attribute_reads(path.read_text()) == []


def test_the_host_object_checker_sees_a_spec_read():
    source = "@cuda.jit(device=True)\ndef f(a):\n    s = cuda.local.array((1, spec.S_TILES, 4), float32)\n"
    assert host_attribute_reads(source) == ["f: spec.S_TILES"]


def test_the_import_rule_checker_sees_relative_imports():
    """The checker itself: v5 imports core, gpu and tiling, through relative imports."""
    imports = tinyflash_imports(PACKAGE / "forward" / "kernels" / "v5_branch_free.py")
    assert {"core.masks.key_stop", "gpu.smem.shared_floats", "forward.kernels.tiling.TileConfig"} <= imports


MEASURED = re.compile(r"\d[\d.,]*\s*(%|×|x|times)\s*(faster|slower|quicker)|the fastest in the \w+ benchmark", re.I)


@pytest.mark.parametrize("path", sources(PACKAGE), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_measurement_in_a_comment(path):
    """'ran 3-4% faster', 'the fastest in the hopper benchmark': a measurement goes stale in a comment; the record
    (figures/data) and the docs' generated numbers hold it."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    prose = [token.string for token in tokens if token.type in (tokenize.COMMENT, tokenize.STRING)]
    assert not [text for text in prose if MEASURED.search(text)]


def test_every_registered_version_has_its_file():
    from tinyflash.backward.kernels import VERSIONS as BACKWARD
    from tinyflash.decode.kernels import VERSIONS as DECODE
    from tinyflash.forward.kernels import VERSIONS as FORWARD

    for registry, folder in ((FORWARD, "forward"), (BACKWARD, "backward"), (DECODE, "decode")):
        pattern = KERNEL_FOLDERS[PACKAGE / folder / "kernels"]
        assert sorted(v.module for v in registry.values()) == sorted(
            p.name for p in (PACKAGE / folder / "kernels").glob(pattern)), folder
