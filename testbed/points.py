"""What a suite asks of one parameter point: its needs, probes and checks rendered with the point's parameters.

``needs:`` (of ``steps.launch`` and of steps), ``steps.launch.probe`` and ``checks:`` may depend on the point: an
item (or the whole ``needs:``) may be a Jinja2 template over the point's parameters, and an entry
``{when: CONDITION, needs|probe: [...]}`` (a check's own ``when:``) applies only where the condition holds. They
see the point's parameters (by name and as ``params``) and ``suite``, nothing of the hosts: what a point needs is
known before any testbed is (``testbed.lint``, ``testbed.run.plan.gpu_refusal``). A bad template or an unknown
need is one ``UsageError`` at the suite's ``file:line``.
"""

from __future__ import annotations

import re
from typing import Any

from testbed import templating
from testbed.errors import UsageError
from testbed.suite import NEEDS, NEEDS_FIX, Check, NeedsWhen, ProbeWhen, Suite, _env, is_template, render
from testbed.yamlfile import Loc


def context(suite: Suite, params: dict[str, Any]) -> dict[str, Any]:
    """What a per-point template sees: the point's parameters, ``params`` and ``suite``."""
    return {**params, "params": params, "suite": suite.name}


def holds(suite: Suite, cond: str, params: dict[str, Any], loc: Loc) -> bool:
    """Whether the condition ``cond`` (written at ``loc``) holds at the point."""
    where = f"{suite.name}: {'.'.join(map(str, loc))}"
    return render("{% if " + cond + " %}1{% endif %}", context(suite, params), shell=False, where=where,
                  at=suite.at(*loc)) == "1"


def _rendered(suite: Suite, text: str, params: dict[str, Any], loc: Loc) -> list[str]:
    """A template item rendered at the point: its words (spaces or commas)."""
    if not is_template(text):
        return [text]
    out = render(text, context(suite, params), shell=False, where=f"{suite.name}: {'.'.join(map(str, loc))}",
                 at=suite.at(*loc))
    return [w for w in re.split(r"[\s,]+", out) if w]


def needs(suite: Suite, value: str | list[Any], params: dict[str, Any], loc: Loc) -> list[str]:
    """A ``needs:`` value (written at ``loc``) at the point: each need once, in order; an unknown one is refused
    at its line."""
    items: list[tuple[str, Loc]] = []
    if isinstance(value, str):
        items = [(value, loc)]
    for i, n in enumerate(value if isinstance(value, list) else []):
        if isinstance(n, NeedsWhen):
            if holds(suite, n.when, params, (*loc, i, "when")):
                items += [(x, (*loc, i, "needs", k)) for k, x in enumerate(n.needs)]
        else:
            items.append((n, (*loc, i)))
    out: list[str] = []
    for text, at in items:
        for word in _rendered(suite, text, params, at):
            if word not in NEEDS:
                raise UsageError(f"{suite.name}: {'.'.join(map(str, at))}: '{word}' is not a need"
                                 + (f" (rendered from {text!r})" if word != text else ""), where=suite.at(*at),
                                 fix=NEEDS_FIX + (" (a template renders to needs separated by spaces or commas, "
                                                  "or to nothing)" if word != text else ""))
            if word not in out:
                out.append(word)
    return out


def varies(value: str | list[Any] | None) -> bool:
    """Whether a ``needs:`` value depends on the point (a template, or a ``{when, needs}`` entry)."""
    if isinstance(value, str):
        return True
    return any(not isinstance(n, str) or is_template(n) for n in value or [])


def launch_needs(suite: Suite, params: dict[str, Any]) -> list[str]:
    """What the ranks need at the point: ``steps.launch.needs``, else the suite's ``requires.accelerator``."""
    launch = suite.steps.launch
    if launch.needs is None:
        return [a for a in [suite.requires.accelerator] if a in ("gpu", "tpu")]
    return needs(suite, launch.needs, params, ("steps", "launch", "needs"))


def probes(suite: Suite, params: dict[str, Any]) -> list[str]:
    """The programs a rehearsal probes at the point (``steps.launch.probe``)."""
    out: list[str] = []
    loc = ("steps", "launch", "probe")
    for i, p in enumerate(suite.steps.launch.probe):
        if isinstance(p, ProbeWhen):
            if holds(suite, p.when, params, (*loc, i, "when")):
                out += [w for k, x in enumerate(p.probe) for w in _rendered(suite, x, params, (*loc, i, "probe", k))]
        else:
            out += _rendered(suite, p, params, (*loc, i))
    return list(dict.fromkeys(out))


def checks(suite: Suite, params: dict[str, Any]) -> list[tuple[int, Check]]:
    """The checks that apply at the point (their ``when:`` holds), with ``file`` and ``contains`` rendered; each
    with its index in ``checks:``."""
    out = []
    for i, c in enumerate(suite.checks):
        if c.when is not None and not holds(suite, c.when, params, ("checks", i, "when")):
            continue
        texts = {}
        for key in ("file", "contains"):
            raw = getattr(c, key)
            if raw is not None and is_template(raw):
                texts[key] = render(raw, context(suite, params), shell=False, where=f"{suite.name}: checks.{i}.{key}",
                                    at=suite.at("checks", i, key))
        out.append((i, c.model_copy(update=texts) if texts else c))
    return out


def sketch(suite: Suite, params: dict[str, Any]) -> str:
    """What the point runs, for a static reading: its prepare steps, launch and recovery steps (not the post steps,
    which copy what these made), each rendered with the point's parameters and every name only a run knows (hosts,
    ``run_dir``, vars) left empty; a command that does not render even so is left out."""
    import functools

    import jinja2

    env = _env(False).overlay(undefined=jinja2.ChainableUndefined)
    st = suite.steps
    ctx = context(suite, params)

    def one(text: str) -> str:
        return str(env.from_string(text).render(**ctx))

    out = []
    for text in [*(x.run for x in st.prepare if x.run), st.launch.command, *(x.run for x in st.recovery if x.run)]:
        try:
            out.append(templating.bounded(functools.partial(one, text)))
        except Exception:  # noqa: S112 - a static reading: what does not render says nothing here
            continue
    return "\n".join(out)
