"""How much of each shipped artifact suite ``testbed new`` gets right from the artifact's README alone.

For each seed README (../shared/seeds/*.txt, or the folder given as the first argument), matched to its shipped
suite by what it says, the draft (testbed.drafting, exactly what ``testbed new --from`` writes) is compared with
the shipped suite on three counts:

- launch: the programs the shipped launch command starts (scripts such as main.py or run.sh, ./executables, and
  the launchers mpirun, torchrun, deepspeed, docker), found in the draft's launch command;
- sources: the shipped sources' repositories (URLs compared without .git, case or the ssh/https form), and their
  pinned commits (a draft's ref is right only when it is the same commit);
- outputs: the shipped output globs whose file name (the last part that is not ``**``, templates as ``*``) a
  draft output's file name matches, either way round as globs.

Prints a Markdown table; the figures in README.md and docs/suites.md come from it. Usage:
``python bench/new_agreement.py [SEEDS_DIR]``; with ``--repositories [SEEDS_DIR ARTIFACTS_DIR]`` the draft is made
from every README.md of the artifact's repository archive (../shared/artifacts), joined in path order.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from testbed import drafting  # noqa: E402
from testbed.suite import load_suite  # noqa: E402

SUITES = {  # the shipped suite of each seed, by what its README says
    "jitc": r"\bJITC\b",
    "tesla": r"\bTesla machine",
    "datastall-emulator": r"\bGPU Emulator\b",
    "isca-resnet18": r"\bISCA50_AE\b",
    "neuronabox": r"\bDDL Emulator\b",
}
LAUNCHERS = ("mpirun", "mpiexec", "torchrun", "deepspeed", "docker", "srun")


def programs(command: str) -> set[str]:
    """The programs a launch command (a template) starts: script and ./executable file names, and launchers."""
    text = re.sub(r"\{%.*?%\}", " ", command)
    text = re.sub(r"(^|[\s;&|])\.\s+\S+", " ", text)  # a file sourced (. ./config.sh) is not a program started
    found = {m.rsplit("/", 1)[-1] for m in re.findall(r"[\w.~/{}-]*[\w-]+\.(?:py|sh)\b", text)}
    found |= {t.rstrip("'\";)").rsplit("/", 1)[-1] for t in re.split(r"[\s'\"]+", text)
              if t.startswith(".") and "/" in t and not re.search(r"\.\w+$", t.rstrip("'\";)"))}
    found |= {w for w in LAUNCHERS if re.search(rf"(^|[\s;&|]){w}\b", text)}
    return {f for f in found if f and "{" not in f}


def norm_url(url: str) -> str:
    url = drafting.https_url(url.strip()).lower().rstrip("/")
    return url.removesuffix(".git")


def output_key(glob: str) -> str:
    glob = re.sub(r"\{%.*?%\}", "", glob)
    glob = re.sub(r"\{\{.*?\}\}", "*", glob)
    parts = [p for p in glob.split("/") if p and p != "**"]
    return parts[-1] if parts else ""


def outputs_of(outs: Any) -> list[str]:
    globs = [g for v in outs.values() for g in v] if isinstance(outs, dict) else list(outs or [])
    return [g for g in globs if output_key(g)]


def compare(suite_name: str, readme: str) -> dict[str, tuple[int, int]]:
    """(right, of) per count for the draft of ``readme`` against shipped suite ``suite_name``."""
    shipped = load_suite(suite_name)
    d = drafting.draft(readme)
    drafted = yaml.safe_load(drafting.to_yaml(d, "draft"))
    want = programs(shipped.steps.launch.command)
    got = programs(drafted["steps"]["launch"]["command"])
    urls = {norm_url(s["repo"]): s.get("ref") for s in drafted.get("sources", [])}
    src_right = sum(norm_url(s.repo) in urls for s in shipped.sources)
    commits_right = sum(bool(s.ref) and urls.get(norm_url(s.repo)) is not None
                        and _same_commit(s.ref or "", urls[norm_url(s.repo)]) for s in shipped.sources)
    outs, mine = outputs_of(shipped.outputs), [output_key(g) for g in drafted.get("outputs", [])]
    outs_right = sum(any(fnmatch.fnmatch(k, output_key(o)) or fnmatch.fnmatch(output_key(o), k) for k in mine)
                     for o in outs)
    return {"launch": (len(want & got), len(want)), "sources": (src_right, len(shipped.sources)),
            "commits": (commits_right, len(shipped.sources)), "outputs": (outs_right, len(outs)),
            "todos": (len(drafting.todo_comments(drafting.to_yaml(d, "draft"))), 0)}


def _same_commit(a: str, b: str) -> bool:
    a, b = a.lower(), str(b).lower()
    return bool(re.fullmatch(r"[0-9a-f]{7,40}", a) and re.fullmatch(r"[0-9a-f]{7,40}", b)
                and (a.startswith(b) or b.startswith(a)))


def match(readme: str) -> str:
    hits = [name for name, pat in SUITES.items() if re.search(pat, readme)]
    if len(hits) != 1:
        raise SystemExit(f"a seed README matches {hits or 'no suite'}: fix SUITES in {__file__}")
    return hits[0]


ARCHIVES = {  # ../shared/artifacts/README.md: the archive of each suite's repository
    "jitc": "open-jitc", "tesla": "Scalable_ViT_DT", "datastall-emulator": "OSRE_DELIVERABLE",
    "isca-resnet18": "ISCA_AE", "neuronabox": "NeuronaBox",
}


def repository_readmes(archive: Path) -> str:
    """Every README.md of an artifact's repository archive, in path order, as one text."""
    import tarfile

    parts = []
    with tarfile.open(archive) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            f = tar.extractfile(m) if m.isfile() and m.name.rsplit("/", 1)[-1].lower() == "readme.md" else None
            if f is not None:
                parts.append(f.read(drafting.MAX_README_BYTES).decode("utf-8", "replace"))
    return "\n\n".join(parts)[:drafting.MAX_README_BYTES]


def main(seeds: Path, artifacts: Path | None = None) -> None:
    """The table over the seed READMEs; with ``artifacts``, over every README.md of each repository archive."""
    rows, total = [], {k: [0, 0] for k in ("launch", "sources", "commits", "outputs")}
    items = [(match(p.read_text()), p.name, p.read_text()) for p in sorted(seeds.glob("*.txt"))] if artifacts is None \
        else [(n, f"{a}.tar.gz (every README.md)", repository_readmes(artifacts / f"{a}.tar.gz"))
              for n, a in ARCHIVES.items()]
    for name, label, text in items:
        got = compare(name, text)
        for k in total:
            total[k][0] += got[k][0]
            total[k][1] += got[k][1]
        rows.append(f"| {name} | {label} | " + " | ".join(f"{got[k][0]}/{got[k][1]}" for k in total)
                    + f" | {got['todos'][0]} |")
    print(f"| suite | {'seed README' if artifacts is None else 'README'} | launch programs | source repos | "
          "source commits | outputs | TODOs |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    share = " | ".join(f"**{a}/{b} ({100 * a / b:.0f}%)**" if b else "-" for a, b in total.values())
    print(f"| **all** | | {share} | |")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--repositories"]
    shared = REPO.parent / "shared"
    main(Path(args[0]) if args else shared / "seeds",
         (Path(args[1]) if len(args) > 1 else shared / "artifacts") if "--repositories" in sys.argv else None)
