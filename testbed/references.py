"""A suite's ``references:``: the artifact's published numbers, each with its source and a justified tolerance.

A reference names a value in the suite's report: a table (the tidy CSV's stem), a column and the row(s) whose
cells equal ``where``. The report compares it with ``value`` (see :mod:`testbed.report.verdicts`)::

    references:
      hardware: {gpu: V100}                 # what the published numbers were measured on
      metrics:
        - metric: fig3 fetch stall, resnet18
          table: fig3_fetch_stall
          where: {model: resnet18}
          column: fetch_stall_fraction
          value: 0.0078
          tolerance: {abs: 0.02, why: "a fraction of epoch time; the page cache varies between runs"}
          source: "make_figures/make_graph_fig3/time3.dat line 3 (the artifact at 5559445)"

``compare: at-most`` (``at-least``) makes the value a bound (a paper's target): ours passes when it is at most
(at least) the value, widened by the tolerance. Several rows matching ``where`` are reduced to one number
(``reduce``): by default the mean for ``equal``, the largest for ``at-most``, the smallest for ``at-least``;
``count`` counts the rows.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed.yamlfile import Invalid

Scalar = bool | int | float | str
HARDWARE_KEYS = ("gpu", "cpus", "tpu")
"""What a reference's hardware may name: a GPU model (matched as a substring of the hosts' GPU names), the core
count of a host, a TPU type; the manifest records the same of every host."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Tolerance(_Strict):
    """How far ours may be from the reference: ``rel`` percent of it, ``abs`` in its unit, or ``exact``."""

    rel: float | None = Field(None, ge=0, description="percent of the reference value")
    abs: float | None = Field(None, ge=0, description="in the metric's unit")
    exact: bool = Field(False, description="equal (counts, outcomes, strings)")
    why: str = Field(min_length=1, description="why this tolerance: what varies between the paper's run and ours")

    @model_validator(mode="after")
    def _one(self) -> Tolerance:
        if (self.rel is not None) + (self.abs is not None) + self.exact != 1:
            raise ValueError("a tolerance needs exactly one of 'rel' (percent), 'abs' or 'exact: true'")
        return self

    def text(self) -> str:
        if self.exact:
            return "exact"
        return f"±{self.rel:g}%" if self.rel is not None else f"±{self.abs:g}"


class Reference(_Strict):
    """One published number and where it sits in the report."""

    metric: str = Field(min_length=1, description="what the verdict table calls it")
    table: str = Field(min_length=1, description="the report table (its CSV's stem) holding our value")
    column: str = Field(min_length=1, description="the table's column holding our value")
    where: dict[str, Scalar] = Field(default_factory=dict, description="the row(s): column -> cell value")
    value: Scalar = Field(description="the published number (or string, with exact: true)")
    compare: Literal["equal", "at-most", "at-least"] = Field("equal", description="equal: ours within the "
                                                             "tolerance of it; at-most, at-least: a bound ours "
                                                             "must keep, widened by the tolerance")
    reduce: Literal["mean", "min", "max", "sum", "count"] | None = Field(
        None, description="how the matching rows make one number; default: mean (equal), max (at-most), min "
        "(at-least); count: how many rows match")
    tolerance: Tolerance = Field(description="how far ours may be from it, and why")
    source: str = Field(min_length=1, description="the committed output file at the pinned commit, or the "
                                                  "paper's figure or table, or the README's words")
    hardware: dict[str, Scalar] | None = Field(None, description="overrides the section's hardware",
                                                json_schema_extra={"example": "hardware: {gpu: A100}"})

    _hw = field_validator("hardware")(classmethod(lambda cls, v: _hardware(v) if v is not None else v))

    @model_validator(mode="after")
    def _kind(self) -> Reference:
        numeric = isinstance(self.value, int | float) and not isinstance(self.value, bool)
        if not numeric and not self.tolerance.exact:
            raise Invalid(f"{self.value!r} is not a number: only 'exact: true' can compare it",
                          loc=("tolerance",), fix="write tolerance: {exact: true, why: ...}")
        if not numeric and self.reduce is not None:
            raise Invalid(f"'reduce: {self.reduce}' needs a number, not {self.value!r}", loc=("reduce",),
                          fix="drop 'reduce' or give a numeric value")
        if not numeric and self.compare != "equal":
            raise Invalid(f"'compare: {self.compare}' needs a number, not {self.value!r}", loc=("compare",),
                          fix="drop 'compare' or give a numeric value")
        return self


def _hardware(v: dict[str, Scalar]) -> dict[str, Scalar]:
    for k in v:
        if k not in HARDWARE_KEYS:
            raise Invalid(f"unknown hardware key '{k}'", loc=(k,), fix=f"use {', '.join(HARDWARE_KEYS)}")
    return v


class References(_Strict):
    """The suite's ``references:`` section."""

    hardware: dict[str, Scalar] = Field(default_factory=dict, description="what the published numbers were "
                                        "measured on: gpu (model), cpus (cores per host), tpu (type)")
    metrics: list[Reference] = Field(min_length=1, description="the published numbers, each a verdict")

    _hw = field_validator("hardware")(classmethod(lambda cls, v: _hardware(v)))

    @field_validator("metrics")
    @classmethod
    def _distinct(cls, v: list[Reference]) -> list[Reference]:
        seen: dict[str, int] = {}
        for i, r in enumerate(v):
            if r.metric in seen:
                raise Invalid(f"two references are named '{r.metric}' (items {seen[r.metric] + 1} and {i + 1})",
                              loc=(i, "metric"), fix="give each reference its own metric name")
            seen[r.metric] = i
        return v
