"""The storage core stands alone: no Scrapy, no Twisted, no import cycle."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import crawler.storage
from tests.conftest import ROOT, crawl_env

STORAGE = Path(crawler.storage.__file__).parent


def storage_modules() -> list[str]:
    found = ["crawler.storage"]
    for info in pkgutil.walk_packages([str(STORAGE)], prefix="crawler.storage."):
        found.append(info.name)
    return sorted(found)


BLOCKED_IMPORT = """
import importlib, sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("scrapy", "twisted"):
            raise ImportError(f"{name} is blocked: the storage core must not need it")
        return None

sys.meta_path.insert(0, Blocked())
for name in sys.argv[1:]:
    importlib.import_module(name)
print("imported", len(sys.argv) - 1)
"""


def test_every_storage_module_imports_with_scrapy_and_twisted_blocked():
    modules = storage_modules()
    assert "crawler.storage.session" in modules and "crawler.storage.writer.server" in modules
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT, *modules],
        cwd=ROOT,
        env=crawl_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"imported {len(modules)}"


def test_the_blocking_works():
    """The check above can fail: a module that needs Scrapy is refused."""
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT, "middlewares.archive"],
        cwd=ROOT,
        env=crawl_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "is blocked: the storage core must not need it" in result.stderr


def module_imports(name: str) -> set[str]:
    """The project modules ``name`` imports when it is loaded (not TYPE_CHECKING ones)."""
    path = STORAGE.parent.parent / (name.replace(".", "/") + ".py")
    if not path.exists():
        path = path.with_suffix("") / "__init__.py"
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:  # module level only: an import in a function is lazy
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                found.add(sub.module)
                found.update(f"{sub.module}.{alias.name}" for alias in sub.names)
            elif isinstance(sub, ast.Import):
                found.update(alias.name for alias in sub.names)
    return found


def test_storage_modules_import_each_other_without_a_cycle():
    modules = set(storage_modules())
    graph = {m: {d for d in module_imports(m) if d in modules and d != m} for m in modules}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join([*path, module]))
        if module in done:
            return
        for dep in graph[module]:
            visit(dep, [*path, module])
        done.add(module)

    for module in sorted(modules):
        visit(module, [])


# Imports go down (docs/design/layout.md): each group of modules, and what none of them
# may load, even lazily (every import in the file counts, not only those at the top).
LAYERS = {
    "crawler.hub": ("scrapy", "twisted", "crawler.spiderkit", "middlewares", "extensions"),
    "crawler.storage": ("crawler.hub", "crawler.spiderkit", "scrapy", "twisted"),
    "crawler.politeness": ("crawler.hub", "crawler.storage", "scrapy", "twisted"),
    "crawler.partition": ("crawler.hub", "crawler.spiderkit", "scrapy", "twisted"),
    "crawler.domains": ("crawler.hub", "crawler.spiderkit", "scrapy", "twisted"),
    "crawler.redact": ("crawler.hub", "crawler.storage", "scrapy", "twisted"),
    "crawler.spillset": ("crawler.hub", "crawler.storage", "scrapy", "twisted"),
}


def package_files(name: str) -> list[Path]:
    path = ROOT / name.replace(".", "/")
    return sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def every_import(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_imports_only_go_down():
    wrong = []
    for layer, blocked in LAYERS.items():
        for path in package_files(layer):
            for name in every_import(path):
                if any(name == b or name.startswith(f"{b}.") for b in blocked):
                    wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert wrong == []


def test_the_layer_check_sees_a_wrong_import(tmp_path):
    """The check above can fail: a hub module importing Scrapy is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from scrapy.exceptions import UsageError\n")
    assert "scrapy.exceptions" in every_import(bad)
