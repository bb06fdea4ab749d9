"""A suite's ``tables:``: results tables declared in YAML, read from the collected run without Python.

Each table reads the files matching ``files`` (a glob relative to each host's folder of the collected run:
``rank*.out``, ``out/**/*.csv``) and makes one row per regex match, CSV row or JSON object::

    tables:
      steps:                                   # a regex with named groups: each match a row
        files: "rank*.out"
        regex: 'step (?P<step>\\d+) loss (?P<loss>[0-9.]+)'
      throughput:                              # CSV: the columns to keep, renamed with a mapping
        files: "out/*.csv"
        format: csv
        columns: {model: model, img_per_s: images_per_s}
      latency:                                 # JSON: a list of objects, one object, or JSON lines
        files: "out/latency.json"
        format: json
        columns: [op, p50_ms]

Every row also has ``host`` (the host folder), ``rank`` (N of a ``rankN.*`` file, else empty) and ``file`` (its
path in the host folder). A column is typed ``int``, ``float`` or ``str`` by its values (every value an integer:
int; every value a number: float; else str), or as ``types:`` says. ``references:`` and ``checks:`` name these
tables as they name the tables of testbed's own parsers (testbed.report.declared builds them).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed import rx
from testbed.yamlfile import Invalid

CONTEXT_COLUMNS = ("host", "rank", "file")
"""The columns every declared (and report.py) table starts with: where each row was read."""
TABLE_NAME_RE = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
GENERIC_TABLES = ("run", "params", "hosts", "events", "timeline", "recovery", "goodput", "lost", "unanswered",
                  "files", "runs", "checks", "verdicts")
"""The tables every report makes (testbed.report.summary; ``runs`` in a campaign's; ``checks`` and ``verdicts``
are written beside them): a suite's own table may not take one of these names."""
ColumnType = Literal["int", "float", "str"]


class DeclaredTable(BaseModel):
    """One table of ``tables:``: the files it reads and how each gives rows."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    files: str = Field(min_length=1, description="a glob relative to each host's folder of the collected run "
                       "(a star matches within a folder, two stars across folders): the files read, on every host",
                       json_schema_extra={"example": 'files: "rank*.out"'})
    regex: str | None = Field(None, description="a regular expression with named groups (?P<name>...): each match "
                              "in a file is a row, each group a column (^ and $ match at each line)",
                              json_schema_extra={"example": r"regex: 'step (?P<step>\d+) loss (?P<loss>\S+)'"})
    format: Literal["regex", "csv", "json"] | None = Field(
        None, description="how the files are read: regex (the default when 'regex' is given), csv (a header "
        "row, then rows), json (a list of objects, one object, or one object per line)",
        json_schema_extra={"example": "format: csv"})
    columns: list[str] | dict[str, str] | None = Field(
        None, description="the groups, CSV columns or JSON keys to keep, in order; a mapping renames them "
        "(file's name: table's name); default: every one",
        json_schema_extra={"example": "columns: {img_per_s: images_per_s, model: model}"})
    types: dict[str, ColumnType] = Field(default_factory=dict, description="a column's type (int, float or str) "
                                         "by its name in the table; default: int when every value is an "
                                         "integer, float when every value is a number, else str",
                                         json_schema_extra={"example": "types: {step: int, loss: float}"})
    delimiter: str = Field(",", min_length=1, max_length=1, description="csv only: the character between "
                           "cells", json_schema_extra={"example": "delimiter: ';'"})

    @field_validator("regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            why = rx.problem(v)
            if why is not None:
                raise Invalid(why, fix="check the pattern (RE2's syntax: Python's re without backreferences and "
                                       "lookaround)")
            if not rx.compile(v).groupindex:
                raise Invalid("the regex has no named group, so its matches would give no column",
                              fix="name each value it captures: (?P<loss>[0-9.]+)")
        return v

    @model_validator(mode="after")
    def _kind(self) -> DeclaredTable:
        if self.format is None:
            if self.regex is None:
                raise Invalid("a table reads its files with a regex or as CSV or JSON",
                              fix="add regex: '(?P<name>...)' or format: csv (or json)")
            self.format = "regex"
        if self.format == "regex" and self.regex is None:
            raise Invalid("format: regex needs 'regex'", loc=("format",), fix="add regex: '(?P<name>...)'")
        if self.format != "regex" and self.regex is not None:
            raise Invalid(f"'regex' reads text, not {self.format}", loc=("regex",),
                          fix=f"drop regex (format: {self.format} reads the file's own columns), or drop format")
        if self.delimiter != "," and self.format != "csv":
            raise Invalid("'delimiter' is for format: csv", loc=("delimiter",), fix="drop it")
        sources = self.sources()
        if self.format == "regex" and sources is not None:
            groups = rx.group_names(self.regex or "")
            for i, s in enumerate(sources):
                if s not in groups:
                    where: tuple[str | int, ...] = ("columns", s) if isinstance(self.columns, dict) \
                        else ("columns", i)
                    raise Invalid(f"'{s}' is not a named group of the regex",
                                  fix=f"keep some of its groups: {', '.join(groups)}", loc=where)
        names = self.names()
        if names is not None:
            for i, n in enumerate(names):
                if n in CONTEXT_COLUMNS:
                    loc: tuple[str | int, ...] = ("columns",) if self.columns is None else (
                        ("columns", list(self.columns)[i]) if isinstance(self.columns, dict) else ("columns", i))
                    raise Invalid(f"column '{n}' would hide the '{n}' column every table has (where a row was "
                                  "read)", loc=loc, fix=f"rename it with a mapping: columns: {{{n}: {n}_name}}")
            if len(set(names)) != len(names):
                raise Invalid("two columns have one name", loc=("columns",), fix="give each column its own name")
            for k in self.types:
                if k not in names:
                    raise Invalid(f"types names '{k}', which is not a column", loc=("types", k),
                                  fix=f"name one of: {', '.join(names)}")
        return self

    def sources(self) -> list[str] | None:
        """The names kept as the files spell them (None: every one)."""
        if self.columns is None:
            return rx.group_names(self.regex) if self.regex else None
        return list(self.columns)

    def names(self) -> list[str] | None:
        """The table's own columns after the context ones, as renamed (None: not known before the files are
        read: every CSV column or JSON key)."""
        if isinstance(self.columns, dict):
            return list(self.columns.values())
        return self.sources()


def table_names(v: dict[str, DeclaredTable]) -> dict[str, DeclaredTable]:
    """A declared table's name is a file stem and no report's own table name."""
    for k in v:
        if not re.match(TABLE_NAME_RE, k):
            raise Invalid(f"'{k}' is not a table name", loc=(k,),
                          fix="start with a letter; then letters, digits, - and _ (it is the CSV's name)")
        if k in GENERIC_TABLES:
            raise Invalid(f"every report has a table '{k}' already", loc=(k,),
                          fix=f"name it otherwise (e.g. my_{k}); taken: {', '.join(GENERIC_TABLES)}")
    return v
