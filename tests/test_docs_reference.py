"""The reference pages of docs/ against the code: nothing added without documentation.

Settings are found where the code reads or sets them (``settings.getint("X")``,
``settings["X"]``, ``settings.set("X", ...)``) and in ``crawler/settings.py``;
request meta keys where a request's or response's ``meta`` is read or written;
commands in ``commands/``, with their actions and options; the catalog's tables in a
catalog the storage core makes. Each failure names what lacks documentation and the
page (and table) to add it to.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest
from scrapy.commands import ScrapyCommand
from scrapy.settings import Settings, default_settings

from tests.conftest import ROOT

DOCS = ROOT / "docs"
SETTINGS_PAGE = DOCS / "reference" / "settings.md"
META_PAGE = DOCS / "reference" / "request-meta.md"
COMMANDS_PAGE = DOCS / "reference" / "commands.md"
DATADIR_PAGE = DOCS / "reference" / "data-directory.md"
# The packages whose code is the project's (tests and benchmarks read settings too,
# but define none).
PACKAGES = (
    "crawler",
    "middlewares",
    "extensions",
    "pipelines",
    "spiders",
    "addons",
    "commands",
    "slurm",
)
SETTING_CALLS = {
    "get", "getbool", "getint", "getfloat", "getlist", "getdict", "getdictorlist",
    "getpriority", "getwithbase", "set", "setdefault",
}  # fmt: skip
META_CALLS = {"get", "setdefault", "pop"}
SETTING_NAME = re.compile(r"[A-Z][A-Z0-9_]+")
# Modules whose ``meta`` names are archive-record metadata, not a request's meta.
NOT_REQUEST_META = ("crawler/storage/", "crawler/tools/", "crawler/hub/", "crawler/report/")
TABLE_ROW = re.compile(r"^\|\s*`(?P<name>[^`]+)`(?P<more>(?:,\s*`[^`]+`)*)\s*\|(?P<rest>.*)$")


def project_modules() -> list[tuple[Path, ast.Module]]:
    paths = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    return [(p.relative_to(ROOT), ast.parse(p.read_text(encoding="utf-8"))) for p in paths]


def _is_settings(node: ast.AST) -> bool:
    while isinstance(node, ast.Call):
        node = node.func
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return "settings" in name.lower()


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level NAME = "string" assignments, so meta[SOURCE_META] is found too."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    out[target.id] = node.value.value
    return out


def _string(node: ast.AST, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def settings_in_code() -> dict[str, str]:
    """Every setting the project's code reads or sets, with where (first seen)."""
    found: dict[str, str] = {}
    for path, tree in project_modules():
        for node in ast.walk(tree):
            name = None
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in SETTING_CALLS
                and _is_settings(node.func.value)
                and node.args
            ):
                name = _string(node.args[0], {})
            elif isinstance(node, ast.Subscript) and _is_settings(node.value):
                name = _string(node.slice, {})
            if name and SETTING_NAME.fullmatch(name):
                found.setdefault(name, f"{path}:{node.lineno}")
    return found


def project_settings() -> dict[str, object]:
    module = importlib.import_module("crawler.settings")
    return {k: v for k, v in vars(module).items() if SETTING_NAME.fullmatch(k)}


def meta_keys_in_code() -> dict[str, str]:
    """Every request meta key the project's code reads or writes, with where."""
    found: dict[str, str] = {}

    def is_meta(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "meta") or (
            isinstance(node, ast.Name) and node.id == "meta"
        )

    for path, tree in project_modules():
        if str(path).startswith(NOT_REQUEST_META):
            continue
        constants = _constants(tree)
        for node in ast.walk(tree):
            keys = []
            if isinstance(node, ast.Subscript) and is_meta(node.value):
                keys = [node.slice]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in META_CALLS
                and is_meta(node.func.value)
                and node.args
            ):
                keys = [node.args[0]]
            elif (
                isinstance(node, ast.keyword)
                and node.arg == "meta"
                and isinstance(node.value, ast.Dict)
            ):
                keys = [k for k in node.value.keys if k is not None]
            for key in keys:
                name = _string(key, constants)
                if name:
                    found.setdefault(name, f"{path}:{node.lineno}")
    return found


def table_rows(page: Path, header: str) -> dict[str, tuple[str, int]]:
    """Names in the first column of the page's tables whose first header cell is
    ``header``: name -> (the rest of the row, its line number)."""
    rows = {}
    current = None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("|"):
            current = None
            continue
        if current is None:
            current = line.strip("| ").split("|")[0].strip()
            continue
        match = TABLE_ROW.match(line)
        if match and current == header:
            names = [match["name"], *re.findall(r"`([^`]+)`", match["more"])]
            for name in names:
                rows[name] = (match["rest"], number)
    return rows


def default_cell(rest: str) -> str:
    return rest.split("|")[0].strip()


def test_every_setting_is_documented_with_its_default():
    documented = table_rows(SETTINGS_PAGE, "setting")
    ours = project_settings()
    read = settings_in_code()
    scrapy_own = {k for k in vars(default_settings) if SETTING_NAME.fullmatch(k)}
    # Scrapy's own settings that the project only reads are Scrapy's to document.
    wanted = {name: "crawler/settings.py" for name in ours}
    wanted.update({k: v for k, v in read.items() if k not in scrapy_own and k not in ours})
    missing = [
        f"{name} (used at {where})"
        for name, where in sorted(wanted.items())
        if name not in documented
    ]
    assert not missing, (
        f"settings without documentation: {', '.join(missing)}. Add a row "
        f"| `NAME` | `default` | meaning | to the table of its part in {SETTINGS_PAGE.relative_to(ROOT)}"
    )
    wrong = []
    for name, value in sorted(ours.items()):
        if name not in documented or isinstance(value, dict):
            continue  # dicts of components: the page says where they are
        rest, line = documented[name]
        cell = default_cell(rest)
        literal = re.fullmatch(r"`([^`]*)`", cell)
        try:
            shown = ast.literal_eval(literal[1]) if literal else cell
        except (ValueError, SyntaxError):
            shown = cell
        if shown != value:
            wrong.append(f"{name}: the page says {cell} (line {line}), the code {value!r}")
    assert not wrong, (
        f"defaults in {SETTINGS_PAGE.relative_to(ROOT)} that differ from crawler/settings.py "
        f"(write the default as a Python literal in backticks): {'; '.join(wrong)}"
    )


def test_every_request_meta_key_is_documented():
    documented = table_rows(META_PAGE, "key")
    missing = [
        f"{key} (used at {where})"
        for key, where in sorted(meta_keys_in_code().items())
        if key not in documented
    ]
    assert not missing, (
        f"request meta keys without documentation: {', '.join(missing)}. Add a row "
        f"| `key` | ... | to the table of its kind in {META_PAGE.relative_to(ROOT)} "
        "(keys a spider may set, keys the project sets, keys of Scrapy and "
        "scrapy-playwright the project uses)"
    )


def command_names() -> list[str]:
    return sorted(p.stem for p in (ROOT / "commands").glob("*.py") if p.stem != "__init__")


def command_sections() -> dict[str, str]:
    """`## scrapy NAME` sections of the commands page: name -> text."""
    text = COMMANDS_PAGE.read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    out = {}
    for part in parts:
        heading = part.splitlines()[0]
        match = re.search(r"`scrapy (\w+)", heading)
        if match:
            out[match[1]] = part
    return out


def command_options(name: str) -> list[str]:
    """The options a project command adds to Scrapy's global ones."""
    command = importlib.import_module(f"commands.{name}").Command()
    command.settings = Settings()
    own = argparse.ArgumentParser(add_help=False)
    command.add_options(own)
    base = argparse.ArgumentParser(add_help=False)
    ScrapyCommand.add_options(command, base)
    known = {s for action in base._actions for s in action.option_strings}
    return [
        s
        for action in own._actions
        for s in action.option_strings
        if s not in known and s.startswith("--") or (s not in known and len(s) == 2)
    ]


def command_actions(name: str) -> list[str]:
    module = importlib.import_module(f"commands.{name}")
    return list(getattr(module, "ACTIONS", ()))


@pytest.mark.parametrize("name", command_names())
def test_every_command_is_documented_with_its_options_and_exit_statuses(name):
    sections = command_sections()
    where = COMMANDS_PAGE.relative_to(ROOT)
    assert name in sections, f"scrapy {name}: no section '## `scrapy {name}`' in {where}"
    text = sections[name]
    missing = [f"action {a}" for a in command_actions(name) if not re.search(rf"\b{a}\b", text)]
    missing += [f"option {o}" for o in command_options(name) if f"`{o}" not in text]
    assert not missing, (
        f"scrapy {name}: {', '.join(missing)} not documented in its section of {where} "
        "(write an option as `--name ...`)"
    )
    assert re.search(r"[Ee]xit status", text), (
        f"scrapy {name}: its section of {where} gives no exit statuses"
    )


def test_every_argument_of_the_site_spider_is_documented():
    from spiders.site import SiteSpider

    arguments = [
        p for p in inspect.signature(SiteSpider.__init__).parameters if p not in ("self", "kwargs")
    ]
    text = command_sections().get("crawl", "")
    missing = [a for a in arguments if f"`-a {a}=" not in text]
    assert not missing, (
        f"arguments of the site spider not documented: {', '.join(missing)}; add "
        f"`-a NAME=...` to the `scrapy crawl` section of {COMMANDS_PAGE.relative_to(ROOT)}"
    )


def test_every_table_of_a_catalog_is_documented(tmp_path):
    from crawler.storage import bookmarks, items
    from crawler.storage.catalog import Catalog

    with Catalog(tmp_path / "metadata.db") as catalog:
        # Every table the storage core's item modules can create, as well as the catalog's.
        for module in (items, bookmarks):
            for name, sql in vars(module).items():
                if name.endswith("_SQL") and "CREATE TABLE" in sql:
                    catalog.conn.execute(sql)
        names = [
            name
            for (name,) in catalog.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
    text = DATADIR_PAGE.read_text(encoding="utf-8")
    missing = [n for n in names if f"`{n}`" not in text]
    assert names and not missing, (
        f"catalog tables not documented: {', '.join(missing)}; describe each in "
        f"{DATADIR_PAGE.relative_to(ROOT)}"
    )


def test_every_path_of_a_data_directory_is_documented():
    from crawler.storage.datadir import DataDir

    datadir = DataDir(Path("data"))
    paths = {
        name: getattr(datadir, name)
        for name, value in vars(DataDir).items()
        if isinstance(value, property)
    }
    text = DATADIR_PAGE.read_text(encoding="utf-8")
    missing = [
        f"{path} (DataDir.{name})"
        for name, path in sorted(paths.items())
        if isinstance(path, Path) and str(path) not in text
    ]
    assert paths and not missing, (
        f"paths of a data directory not documented: {', '.join(missing)}; add each to "
        f"the listing at the top of {DATADIR_PAGE.relative_to(ROOT)}"
    )
