"""Items as rows of item tables: which table, which columns, which values.

The rule (docs/how-to/item-tables.md):

- table: the item class's ``catalog_table`` attribute if it has one, else the class
  name in snake_case (``PageSummary`` -> ``page_summary``); a plain dict goes to a
  table named after the spider;
- columns: the item's fields (ItemAdapter's names); a field's ``sqlite_type``
  metadata (``scrapy.Field(sqlite_type="REAL")``, ``field(metadata={...})``) or else
  its first value decides the column's type; values are encoded as
  ``crawler/storage/itemvalues.py`` says (lists and dicts as JSON text, NaN as NULL,
  said once per field);
- reserved: the catalog's tables and names (``crawler.storage.items.reserved_table``)
  are never an item table; nor can two fields of one item differ only in case
  (SQLite's column names ignore case): such an item is an ``item_error``, and the
  page and its other items are stored;
- primary key: ``(_key, _seq)``, or the fields the class names in ``catalog_key``.

Any item type ItemAdapter knows is accepted (scrapy.Item, dataclass, attrs, dict).
"""

from __future__ import annotations

import dataclasses
import re
from functools import lru_cache

from itemadapter import ItemAdapter
from itemadapter.adapter import DataclassAdapter

from crawler.storage.items import RESERVED_RULE, ItemRow, reserved_table
from crawler.storage.itemvalues import TYPES, ItemValueError, encode_values

TYPE_META = "sqlite_type"
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ItemFieldError(ValueError):
    """An item cannot become a row; ``field`` names the culprit (None: the item)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field

    def describe(self, spider: str, item, url: str) -> str:
        """The one line an ``item_error`` says: spider, item class, field, page."""
        where = f"field {self.field!r}" if self.field else "item"
        return (
            f"item not stored: spider {spider!r}, item class {type(item).__name__}, "
            f"{where}, page {url}: {self}"
        )


def snake_case(name: str) -> str:
    return _CAMEL.sub("_", name).lower()


@lru_cache(maxsize=256)
def _class_rule(cls: type) -> tuple[str | None, tuple[str, ...], dict[str, str]]:
    table = getattr(cls, "catalog_table", None)
    if table is None and not issubclass(cls, dict):
        table = snake_case(cls.__name__)
    natural = getattr(cls, "catalog_key", ())
    if isinstance(natural, str):
        natural = (natural,)
    types = {}
    for name in ItemAdapter.get_field_names_from_class(cls) or ():
        declared = ItemAdapter.get_field_meta_from_class(cls, name).get(TYPE_META)
        if declared:
            declared = str(declared).upper()
            if declared not in TYPES:
                raise ItemFieldError(
                    f"{cls.__name__}.{name}: {TYPE_META}={declared!r} is not one of {TYPES}", name
                )
            types[name] = declared
    return table, tuple(natural), types


@lru_cache(maxsize=256)
def dataclass_fields(cls: type) -> tuple[str, ...] | None:
    """The fields of ``cls`` when ItemAdapter reads its items as dataclasses, else None.

    Such an item's values are then read here as that adapter reads them (each field the
    instance has, in order): an adapter per item cost a third of turning it into a row.
    """
    if not dataclasses.is_dataclass(cls):
        return None
    # Whichever adapter ItemAdapter would pick (it takes the first that accepts).
    for adapter in ItemAdapter.ADAPTER_CLASSES:
        if adapter.is_item_class(cls):
            if adapter is not DataclassAdapter:
                return None
            return tuple(f.name for f in dataclasses.fields(cls))
    return None


_MISSING = object()


def item_values(item):
    """(field, value) of each field ``item`` has, as ``ItemAdapter(item).items()``."""
    cls = type(item)
    if cls is dict:
        return item.items()
    fields = dataclass_fields(cls)
    if fields is None:
        return ItemAdapter(item).items()
    pairs = [(name, getattr(item, name, _MISSING)) for name in fields]
    return [pair for pair in pairs if pair[1] is not _MISSING]


def table_name(item, spider_name: str) -> str:
    """The table ``item`` goes to (see the module's docstring)."""
    return _class_rule(type(item))[0] or spider_name


def item_row(item, spider_name: str) -> ItemRow:
    """``item`` as a row; raises ItemFieldError naming the field that cannot be stored."""
    table, natural, types = _class_rule(type(item))
    table = table or spider_name
    if problem := _table_problem(table):
        raise ItemFieldError(problem)
    try:
        values, nan_fields = encode_values(item_values(item))
    except ItemValueError as exc:
        raise ItemFieldError(str(exc), exc.field) from None
    if problem := _names_problem(tuple(values)):
        raise ItemFieldError(*problem)
    missing = [n for n in natural if values.get(n) is None]
    if missing:
        raise ItemFieldError(f"natural key field {missing[0]!r} is empty", missing[0])
    return ItemRow(table, values, types, natural, tuple(nan_fields))


@lru_cache(maxsize=256)
def _table_problem(table: str) -> str | None:
    if not reserved_table(table):
        return None
    return (
        f"table {table!r} is reserved for the catalog ({RESERVED_RULE}): name another "
        "with the class's catalog_table"
    )


@lru_cache(maxsize=1024)
def _names_problem(names: tuple[str, ...]) -> tuple[str, str] | None:
    """(message, field) when the field names of an item cannot be its columns; the
    answer per set of names is kept: items of one class share theirs."""
    folded: dict[str, str] = {}
    for name in names:
        if not _NAME.match(name) or name.startswith("_"):
            return (
                f"field name {name!r} is not a column name (letters, digits, _; "
                "not starting with _)",
                name,
            )
        twin = folded.setdefault(name.lower(), name)
        if twin != name:
            return (
                f"fields {twin!r} and {name!r} differ only in case, and one column "
                "holds both (SQLite's column names ignore case): rename one",
                name,
            )
    return None
