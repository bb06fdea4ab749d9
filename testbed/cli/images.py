"""CLI commands for images of a set-up: ``image bake``, ``image list`` and ``image prune`` (testbed.setup.images
does the work; these render what it returns)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from testbed.cli import complete
from testbed.cli.common import JsonOpt, console, existing_store, print_json, store
from testbed.cli.output import Plain
from testbed.textfmt import plural, size

image_app = typer.Typer(help="Images of a set-up: bake one from a host, list them, prune them.",
                        no_args_is_help=True)


def baked_line(img: dict[str, Any]) -> str:
    """One line for an image just baked (or found already baked)."""
    how = "baked" if img.get("new") else "already baked"
    return (f"image {img['id']} {how}: {img['plan']} from {img['testbed']}/{img['host']}, {size(img['size'])} at "
            f"{img['location']} (key {img['key'][:12]}); new testbeds with this set-up, and hosts repaired, boot "
            "from it")


def bake(name: Annotated[str, typer.Argument(help="Testbed name.", autocompletion=complete.testbeds)],
         host: Annotated[str | None, typer.Option("--host", help="The host to bake from (default: the first).")]
         = None,
         profile: Annotated[str | None, typer.Option("--profile", "-P", help="The set-up the image holds (default: "
                                                                            "the one last applied).",
                                                     autocompletion=complete.profiles)] = None,
         json_out: JsonOpt = False) -> None:
    """Make an image of a host whose set-up has just passed (refused otherwise), keyed by that set-up's content
    address: new testbeds of that set-up, and hosts repaired with a new disk, boot from it.

    Example: testbed image bake local --profile local-suites
    """
    # lazy: testbed --help and completion load every command module
    from testbed.resolved import Resolved
    from testbed.setup import images

    tb = Resolved.open(name, store())
    img = images.bake(tb, host, profile=profile)
    if json_out:
        print_json(img)
        return
    console().print(baked_line(img))


def list_images(json_out: JsonOpt = False) -> None:
    """Every image: its key, profile, size, where it lives, what it costs a month and the testbeds using it.

    Example: testbed image list --json
    """
    # lazy: testbed --help and completion load every command module
    from testbed import expiry, paths

    st = existing_store()
    rows = expiry.image_listing(st, expiry.prices(paths.home())) if st.exists else []
    if json_out:
        print_json({"images": rows})
        return
    out = Plain()
    if not rows:
        out.write("no images (testbed setup NAME --bake, or testbed image bake NAME, makes one)")
        return
    out.table(f"{plural(len(rows), 'image')}", ["id", "profile", "provider", "size", "where", "per month",
                                                 "used by", "baked from"],
              [[r["id"], r["profile"], r["provider"], size(r["size"]), r["location"], _cost(r["cost"]),
                ", ".join(r["used_by"]) or "-", r["baked_from"]] for r in rows], whole=["id"])


def _cost(c: dict[str, Any]) -> str:
    if c.get("per_month") is None:
        return "?"
    return f"{c['per_month']:.2f} {c['unit']}"


def prune(ids: Annotated[list[str] | None, typer.Argument(help="Images to delete (id or a key's first "
                                                                 "characters); none: every image no testbed uses.")]
          = None,
          yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
          json_out: JsonOpt = False) -> None:
    """Delete images where they live and forget them: those named, else every image no testbed uses. An image a
    testbed boots from is refused. Destroy and the dead-man's switch never delete an image: this does.

    Example: testbed image prune
    """
    # lazy: testbed --help and completion load every command module
    from testbed.setup import images

    st = existing_store(readonly=False)
    if not st.exists:
        if json_out:
            print_json({"deleted": []})
        else:
            console().print("no images")
        return
    if not yes and sys.stdin.isatty():
        typer.confirm("delete " + (", ".join(ids) if ids else "every image no testbed uses") + "?", abort=True)
    gone = images.prune(st, ids or None, progress=None if json_out else (lambda m: console().print(f"  {m}")))
    if json_out:
        print_json({"deleted": gone})
        return
    console().print(f"deleted {plural(len(gone), 'image')}" + (": " + ", ".join(r["id"] for r in gone)
                                                                 if gone else ""))


def register(app: typer.Typer) -> None:
    """Add ``testbed image bake|list|prune``."""
    image_app.command("bake")(bake)
    image_app.command("list")(list_images)
    image_app.command("prune")(prune)
    app.add_typer(image_app, name="image")
