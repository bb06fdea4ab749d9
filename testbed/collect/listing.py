"""What a host holds for a run: the output globs expanded on the host, with size, mtime and sha256 of each file.

``listing_script`` is the one remote command (``bash -s``) per host: it expands the run's output globs
(run-relative, ``~/``-relative or absolute), hashes what changed since the last collect, says whether rsync is
installed and prints the host's facts when asked; ``parse_listing`` reads its output back.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.collect import manifest as mf

LOG_PATTERNS = ("rank*.out", "rank*.err", "rank*.exit", "rank*.start", "rank*.end")
RUNS_DIR = "~/.testbed-runs"


@dataclass
class Listing:
    run_dir: str = ""
    home: str = ""
    rsync: bool = False
    files: dict[str, tuple[int, str]] = field(default_factory=dict)  # path -> (size, sha256)
    mtimes: dict[str, int] = field(default_factory=dict)  # path -> mtime on the host (s)
    nomatch: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fact_lines: list[str] = field(default_factory=list)


def output_patterns(info: dict[str, Any], host: str) -> tuple[list[str], list[str]]:
    """(patterns, notes): the logs plus the run's declared outputs for ``host``.

    Outputs may be relative to the run folder, ``~/``-relative or absolute; suites are checked when they load
    (``suite.output_pattern_problem``), so a pattern refused here comes from a hand-edited state only.
    """
    from testbed.suite import output_pattern_problem

    outputs = info.get("outputs") or {}
    declared: list[str] = []
    if isinstance(outputs, list):
        declared = [str(p) for p in outputs]
    elif isinstance(outputs, dict):
        declared = [str(p) for p in (outputs.get("*") or [])] + [str(p) for p in (outputs.get(host) or [])]
    pats, notes = list(LOG_PATTERNS), []
    for p in declared:
        problem = output_pattern_problem(p)
        if problem:
            notes.append(f"output pattern {p!r} ignored: {problem}")
        elif p not in pats:
            pats.append(p)
    return pats, notes


HOME_DIR = "@home"
"""Where files matched by ``~/`` output globs land in a host's results folder (``<host>/@home/<path>``)."""
ROOT_DIR = "@root"
"""Where files matched by absolute output globs land (``<host>/@root/<absolute path>``)."""


def host_path(lst: Listing, key: str) -> str:
    """The file's path on the host, for a path in a host's results folder."""
    if key.startswith(HOME_DIR + "/"):
        return f"{lst.home}/{key[len(HOME_DIR) + 1:]}"
    if key.startswith(ROOT_DIR + "/"):
        return "/" + key[len(ROOT_DIR) + 1:]
    return f"{lst.run_dir}/{key}"


def origin(key: str, run_dir: str) -> str:
    """Where a file of a host's results folder came from on the host (``~/``, absolute or in the run folder)."""
    if key.startswith(HOME_DIR + "/"):
        return "~/" + key[len(HOME_DIR) + 1:]
    if key.startswith(ROOT_DIR + "/"):
        return "/" + key[len(ROOT_DIR) + 1:]
    return f"{run_dir.rstrip('/')}/{key}"


def roots(lst: Listing, paths: list[str]) -> list[tuple[str, str, list[str]]]:
    """(host folder, local sub-folder, paths relative to both) for each root the paths live under."""
    groups: dict[str, list[str]] = {}
    for p in paths:
        top = p.split("/", 1)[0]
        groups.setdefault(top if top in (HOME_DIR, ROOT_DIR) else "", []).append(
            p[len(top) + 1:] if top in (HOME_DIR, ROOT_DIR) else p)
    out = []
    for top, rel in groups.items():
        remote = {"": lst.run_dir, HOME_DIR: lst.home, ROOT_DIR: ""}[top]
        out.append((remote, top, rel))
    return out


# host level --------------------------------------------------------------------------------------
def remote_dir(info: dict[str, Any], run_id: str) -> str:
    """Shell words for the run folder on the host (``~/`` expanded by the host's shell)."""
    from testbed.suite import path_word

    return path_word(str(info.get("run_dir") or f"{RUNS_DIR}/{run_id}"))


_PY_HASH = shlex.quote("""import hashlib, sys
for p in sys.stdin.buffer.read().split(b"\\0")[:-1]:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    print(h.hexdigest())
""")


def listing_script(run_dir_words: str, patterns: list[str], known: Sequence[tuple[int, int, str, str]] = (),
                   source_words: Sequence[str] = ()) -> str:
    """The bash script run on a host: run folder, rsync presence, then ``F<TAB>size<TAB>mtime<TAB>sha256<TAB>path``.

    ``known``: (size, mtime, sha256, path) of files already collected; a file whose size and mtime are unchanged
    (rsync's quick check) gets its known checksum instead of being hashed again, so a re-collect reads nothing.
    ``source_words``: the run's source checkouts (shell words); files outside the run folder that git tracks there
    unchanged are the artifact's own (an output folder committed with the paper's results), never this run's.
    """
    pats = " ".join(shlex.quote(p) for p in patterns)
    srcs = " ".join(source_words)
    known_lines = "".join(f"{size}\t{mtime}\t{sha}\t{path}\n" for size, mtime, sha, path in known
                          if "\n" not in path)
    return rf"""set -u
export LC_ALL=C
: "${{HOME:=/nonexistent}}"
if ! cd -- {run_dir_words} 2>/dev/null; then echo "@NODIR"; else
echo "@DIR $(pwd -P)"
echo "@HOME $HOME"
tb_ref=$(mktemp)  # files outside the run folder count only when written since the run folder was made
tb_since=$(stat -c %Z tb-rank.sh 2>/dev/null || echo 0)
touch -d "@$((tb_since - 2))" "$tb_ref" 2>/dev/null || touch -t 197001010000 "$tb_ref"
trap 'rm -f "$tb_ref"' EXIT
if command -v rsync >/dev/null 2>&1; then echo "@RSYNC 1"; else echo "@RSYNC 0"; fi
shopt -s nullglob dotglob globstar
declare -A seen=() K=()
files=()
while IFS=$'\t' read -r ksz kmt ksha kpath; do K["$kpath"]="$ksz $kmt $ksha"; done <<'TB_KNOWN_EOF'
{known_lines}TB_KNOWN_EOF
tb_hash() {{  # NUL-separated paths in, one hex digest per line out (python's sha256 uses SHA-NI; coreutils may not)
  if command -v python3 >/dev/null 2>&1; then python3 -c {_PY_HASH}
  else xargs -0 sha256sum -- | sed 's/^\\//' | cut -c1-64; fi
}}
declare -A tb_pristine=()
for tb_s in {srcs}; do  # tracked and unchanged in a source checkout: the artifact's files, not outputs
  [[ -d $tb_s/.git ]] || continue
  unset tb_mod; declare -A tb_mod=()
  while IFS= read -r -d '' x; do tb_mod["$x"]=1; done < <(git -C "$tb_s" ls-files -m -z 2>/dev/null)
  while IFS= read -r -d '' x; do [[ -n ${{tb_mod[$x]+x}} ]] || tb_pristine["$tb_s/$x"]=1
  done < <(git -C "$tb_s" ls-files -z 2>/dev/null)
done
add() {{  # a matched path -> its place in the results folder: run-relative, @home/..., @root/...
  case "$1" in *$'\n'*) echo "@NOTE skipped a file with a newline in its name"; return ;; esac
  if [[ $kind != run && -n ${{tb_pristine[$1]+x}} ]]; then pr=$((pr+1)); return 1; fi
  local f="${{1#./}}"
  case "$kind" in
    home) f="{HOME_DIR}/${{f#"$HOME"/}}" ;;
    root) f="{ROOT_DIR}$f" ;;
    *) case "$f" in {HOME_DIR}/*|{ROOT_DIR}/*)
         echo "@NOTE skipped $f: {HOME_DIR}/ and {ROOT_DIR}/ hold the files from outside the run folder"; return ;;
       esac ;;
  esac
  if [[ -z "${{seen[$f]+x}}" ]]; then seen[$f]=1; tb_src["$f"]=$1; files+=("$f"); fi
}}
declare -A tb_src=()
for pat in {pats}; do
  n=0; old=0; pr=0
  case "$pat" in "~/"*) kind=home; glob="${{pat#"~/"}}" ;; /*) kind=root; glob=$pat ;; *) kind=run; glob=$pat ;; esac
  IFS=$'\n'
  if [[ $kind == home ]]; then ms=("$HOME"/$glob); else ms=($glob); fi
  unset IFS
  for m in "${{ms[@]}}"; do
    if [[ -d $m ]]; then
      newer=(); [[ $kind == run ]] || newer=(-newer "$tb_ref")
      while IFS= read -r -d '' x; do add "$x" && n=$((n+1))
      done < <(find -L "$m" -type f "${{newer[@]}}" -print0 2>/dev/null)
    elif [[ -f $m ]]; then
      if [[ $kind == run || $m -nt $tb_ref ]]; then add "$m" && n=$((n+1)); else old=$((old+1)); fi
    fi
  done
  [[ $old -gt 0 ]] && printf '@NOTE %s: %s matching file(s) left out: not written during this run\n' "$pat" "$old"
  [[ $pr -gt 0 ]] && printf '@NOTE %s: %s matching file(s) left out: the source checkout holds them unchanged\n' \
    "$pat" "$pr"
  [[ $n -eq 0 && $old -eq 0 && $pr -eq 0 ]] && printf '@NOMATCH %s\n' "$pat"
done
if ((${{#files[@]}})); then
  mapfile -t S < <(for f in "${{files[@]}}"; do printf '%s\0' "${{tb_src[$f]}}"; done | xargs -0 stat -L -c '%s %Y' --)
  declare -a Hm=() todo=()
  if [[ ${{#S[@]}} -eq ${{#files[@]}} ]]; then
    for i in "${{!files[@]}}"; do
      k=${{K[${{files[i]}}]-}}
      if [[ -n $k && "${{k% *}}" == "${{S[i]}}" ]]; then Hm[i]=${{k##* }}; else todo+=("$i"); fi
    done
    if ((${{#todo[@]}})); then
      mapfile -t H < <(for i in "${{todo[@]}}"; do printf '%s\0' "${{tb_src[${{files[i]}}]}}"; done | tb_hash)
      if [[ ${{#H[@]}} -eq ${{#todo[@]}} ]]; then
        j=0
        for i in "${{todo[@]}}"; do Hm[i]=${{H[j]}}; j=$((j+1)); done
      fi
    fi
  fi
  if [[ ${{#S[@]}} -ne ${{#files[@]}} || ${{#Hm[@]}} -ne ${{#files[@]}} ]]; then
    echo "@ERR a file vanished or is unreadable while it was being checksummed"
  else
    for i in "${{!files[@]}}"; do
      printf 'F\t%s\t%s\t%s\t%s\n' "${{S[i]% *}}" "${{S[i]#* }}" "${{Hm[i]}}" "${{files[i]}}"
    done
  fi
fi
fi
"""


def source_words(info: dict[str, Any]) -> list[str]:
    """Shell words for the run's source checkouts on a host."""
    from testbed.suite import path_word

    return [path_word(str(s["path"])) for s in (info.get("sources") or {}).values()
            if isinstance(s, dict) and s.get("path")]


def parse_listing(stdout: str) -> tuple[Listing, str | None]:
    """Parse the output of :func:`listing_script` (+ fact lines): (listing, problem or None)."""
    lst = Listing()
    for ln in stdout.splitlines():
        if ln.startswith("F\t"):
            parts = ln.split("\t", 4)
            if len(parts) == 5 and parts[1].isdigit() and parts[2].lstrip("-").isdigit() and len(parts[3]) == 64:
                lst.files[parts[4]] = (int(parts[1]), parts[3])
                lst.mtimes[parts[4]] = int(parts[2])
        elif ln == "@NODIR":
            return lst, ln
        elif ln.startswith("@DIR "):
            lst.run_dir = ln[5:]
        elif ln.startswith("@HOME "):
            lst.home = ln[6:].rstrip("/")
        elif ln.startswith("@RSYNC "):
            lst.rsync = ln.endswith("1")
        elif ln.startswith("@NOMATCH "):
            lst.nomatch.append(ln[9:])
        elif ln.startswith("@NOTE "):
            lst.notes.append(ln[6:])
        elif ln.startswith("@ERR "):
            return lst, ln[5:]
        elif ln.startswith(mf.FACT_PREFIXES):
            lst.fact_lines.append(ln)
    return lst, None
