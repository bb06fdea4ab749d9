#!/bin/bash
# testbed collect: what a host holds for a run, one round trip (testbed.collect.listing.listing_script builds the
# call, parse_listing reads its output).
# usage: listing.sh RUN_DIR KNOWN SOURCES BACKGROUND LAZY STREAM BUDGET PATTERN...
#   RUN_DIR     the run folder ("~" and "~/" at the start of it and of SOURCES are $HOME)
#   KNOWN       lines "size<TAB>mtime<TAB>ctime_ns<TAB>inode<TAB>sha256<TAB>path" of files already collected, as
#               this listing said of them when it hashed them: a file whose four are unchanged gets its known
#               checksum instead of being read again (the ctime moves on every write and utime and no user sets
#               it: size and mtime alone, rsync's quick check, miss a rewrite that kept them)
#   SOURCES     the run's source checkouts, one a line: files outside the run folder that git tracks there
#               unchanged are the artifact's own (an output folder committed with a paper's results), never outputs
#   BACKGROUND  a program for bash run while the files are hashed (the host's facts), "" for none; its output
#               follows the listing
#   LAZY        "N B": when at least N files, or B bytes, need hashing and python3 is here, print "-" for their
#               checksum instead (the collector streams them and the host hashes them while sending); "0 0":
#               always hash
#   STREAM      "" or "TOKEN RATE SOURCE": when the files are listed with "-" (LAZY), send them right after the
#               listing, in its order, as testbed/scripts/stream.py does (SOURCE: its text; RATE: bytes/s, 0: no
#               limit), after a line "@STREAM TOKEN"; BACKGROUND's output then comes before the listing
#   BUDGET      seconds the listing may take (0: no limit): past it, it stops with "@ERR" naming how far it got,
#               and whatever it started is killed (so nothing outlives a collect that gave up)
#   PATTERN     output globs: relative to the run folder, "~/"-relative or absolute; files matched outside the
#               run folder count only when written since the run folder was made (its tb-rank.sh). Folders are
#               walked once each (no loop walked round); a symlink is followed only where it stays inside the run
#               folder (for a run-relative glob) or the folder the glob matched (the others)
# prints "@DIR path", "@HOME path", "@RSYNC 1|0", "@NOW ns" (the clock before the files' stat),
# "F<TAB>size<TAB>mtime<TAB>ctime_ns|-<TAB>inode<TAB>sha256|-<TAB>path" per file (files from outside the run folder
# under @home/ and @root/; ctime "-" where stat gives no ns), "@NOMATCH pattern", "@NOTE text", "@ERR text"; only
# "@NODIR" when the run folder does not exist; then BACKGROUND's output (unless STREAM) and "@END".
set -u
export LC_ALL=C
: "${HOME:=/nonexistent}"
tb_dir=$1
tb_known=$2
tb_sources=$3
tb_background=$4
read -r tb_lazy_n tb_lazy_b <<< "$5"
tb_stream=$6
tb_budget=$7
tb_until=$((${EPOCHSECONDS:-$(date +%s)} + ${tb_budget%.*}))  # the budget counts from here
shift 7
case $tb_dir in \~) tb_dir=$HOME ;; \~/*) tb_dir=$HOME/${tb_dir#\~/} ;; esac
tb_tmp=
trap '[[ -z $tb_tmp ]] || rm -rf "$tb_tmp"' EXIT
tb_mktemp() { [[ -n $tb_tmp ]] || tb_tmp=$(mktemp -d) || exit 1; }
if [[ ${tb_budget%.*} -gt 0 ]]; then  # the backstop: everything this listing started, killed past its budget
  {
    sleep $((${tb_budget%.*} + 5)) || exit 0
    for tb_c in $(pgrep -P $$); do [[ $tb_c == "$BASHPID" ]] || kill -KILL "$tb_c"; done
    kill -KILL $$
  } > /dev/null 2>&1 &
  tb_watchdog=$!
  trap '[[ -z $tb_tmp ]] || rm -rf "$tb_tmp"; kill "$tb_watchdog" 2> /dev/null' EXIT
fi
if [[ -n $tb_background ]]; then
  tb_mktemp
  bash -c "$tb_background" > "$tb_tmp/background" 2> /dev/null &
  tb_bg=$!
fi

tb_hash() {  # NUL-separated paths in, one hex digest per line out
  xargs -0 sha256sum -- | sed 's/^\\//' | cut -c1-64
}

# the whole listing when python3 is here (bash takes ~1 ms a file): the known lines, then per pattern a record
# "P\0kind\0pattern\0" followed by "M\0match\0" per match of its glob (expanded by bash), all on stdin
# shellcheck disable=SC2016  # python source, not shell
TB_LIST_PY='import os, sys  # hashlib only when it hashes: its import is a third of the start-up
home, lazy_n, lazy_b = os.fsencode(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out = sys.stdout.buffer
data = sys.stdin.buffer.read().split(b"\0")
known = {}
for ln in data[0].split(b"\n"):  # size, mtime, ctime_ns, inode, sha256, path
    k = ln.split(b"\t", 5)
    if len(k) == 6 and k[5]:
        known[k[5]] = k[:5]
pristine = set()  # tracked and unchanged in a source checkout: the artifact'"'"'s files, not outputs
for s in os.fsencode(sys.argv[4]).split(b"\n"):
    s = home if s == b"~" else home + s[1:] if s.startswith(b"~/") else s
    if s and os.path.isdir(s + b"/.git"):
        import subprocess
        def ls(*a):
            r = subprocess.run(["git", "-C", s, "ls-files", "-z", *a], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            return set(r.stdout.split(b"\0")[:-1]) if r.returncode == 0 else set()
        modified = ls("-m")
        pristine.update(s + b"/" + x for x in ls() if x not in modified)
try:
    ref = (int(os.stat(b"tb-rank.sh").st_ctime) - 2) * 10**9  # outside the run folder: written since it was made
except OSError:
    ref = -2 * 10**9
def newer(p):
    try:
        return os.stat(p).st_mtime_ns > ref
    except OSError:
        return False
budget, until = (float(x or 0) for x in (sys.argv[6].split() + ["0", "0"])[:2])
import time
deadline, entries, LIMIT = until if budget > 0 else None, 0, 2000000
here = os.path.realpath(b".")
def inside(p, top):
    return p == top or p.startswith(top.rstrip(b"/") + b"/")
def stop(why):
    out.write(b"@ERR %s\n" % why)
    out.flush()
    sys.exit(0)
def tick(d):  # bounded work: a time budget and a number of entries, named when either runs out
    global entries
    entries += 1
    if entries % 512 == 0 and deadline is not None and time.time() > deadline:
        stop(b"the listing stopped after %d s, %d entries in, at %s: too many files for one listing" % (
            budget, entries, d))
    if entries > LIMIT:
        stop(b"the listing stopped at %d entries, at %s: too many files for one listing" % (LIMIT, d))
visited = set()  # each directory (device, inode) entered once: no loop is walked round, nothing walked twice
outside = [0]
def walk(top, bound):  # the files under TOP; a symlink is followed only where it stays under BOUND
    stack = [top]
    while stack:  # bounded: each directory is entered once
        d = stack.pop()
        try:
            st = os.stat(d)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in visited:
            continue
        visited.add((st.st_dev, st.st_ino))
        try:
            entries_here = sorted(os.scandir(d), key=lambda e: e.name, reverse=True)
        except OSError:
            continue
        for e in entries_here:
            tick(d)
            try:
                if e.is_symlink() and not inside(os.path.realpath(e.path), bound):
                    outside[0] += 1
                elif e.is_dir():
                    stack.append(e.path)
                elif e.is_file():
                    yield e.path
            except OSError:
                continue
pats, seen, files = [], set(), []
i = 1
while i + 2 < len(data) and data[i] == b"P":  # bounded: i grows by 3, then by 2 per match
    kind, pat, n, old, pr = data[i + 1], data[i + 2], 0, 0, 0
    i += 3
    while i + 1 < len(data) and data[i] == b"M":
        m = data[i + 1]
        i += 2
        tick(m)
        bound = here if kind == b"run" else os.path.realpath(m)
        if kind == b"run" and not inside(os.path.realpath(m), here):  # a symlink out of the run folder
            outside[0] += 1
            continue
        if os.path.isdir(m):
            found = [x for x in walk(m, bound) if kind == b"run" or newer(x)]
        elif os.path.isfile(m):
            if kind != b"run" and not newer(m):
                old += 1
                continue
            found = [m]
        else:
            continue
        for x in found:
            if b"\n" in x:
                out.write(b"@NOTE skipped a file with a newline in its name\n")
                n += 1
                continue
            if kind != b"run" and x in pristine:
                pr += 1
                continue
            n += 1
            f = x[2:] if x.startswith(b"./") else x
            if kind == b"home":
                f = b"@home/" + (f[len(home) + 1:] if f.startswith(home + b"/") else f)
            elif kind == b"root":
                f = b"@root" + f
            elif f.startswith((b"@home/", b"@root/")):
                out.write(b"@NOTE skipped %s: @home/ and @root/ hold the files from outside the run folder\n" % f)
                continue
            if f not in seen:
                seen.add(f)
                files.append((f, x))
    if old:
        out.write(b"@NOTE %s: %d matching file(s) left out: not written during this run\n" % (pat, old))
    if pr:
        out.write(b"@NOTE %s: %d matching file(s) left out: the source checkout holds them unchanged\n" % (pat, pr))
    if outside[0]:
        out.write(b"@NOTE %s: %d symlink(s) leading out of the folder it matched left out (not followed)\n" % (
            pat, outside[0]))
    if not (n or old or pr or outside[0]):
        out.write(b"@NOMATCH %s\n" % pat)
    outside[0] = 0
rows, todo = [], []
out.write(b"@NOW %d\n" % time.time_ns())  # before the stat: a ctime this close may not move on a write (RACY_NS)
for key, src in sorted(files):  # the order files are sent in (as the collector sorts what it sends)
    try:
        st = os.stat(src)
    except OSError:
        out.write(b"@ERR a file vanished or is unreadable while it was being checksummed\n")
        sys.exit(0)
    stamp = b"%d\t%d\t%d\t%d" % (st.st_size, int(st.st_mtime), st.st_ctime_ns, st.st_ino)
    k = known.get(key)
    row = [key, st.st_size, stamp, k[4] if k and b"\t".join(k[:4]) == stamp else None, src]
    rows.append(row)
    if row[3] is None:
        todo.append(row)
lazy = lazy_n > 0 and todo and (len(todo) >= lazy_n or sum(r[1] for r in todo) >= lazy_b)
if todo and not lazy:
    import hashlib
for r in todo:
    if lazy:
        r[3] = b"-"
        continue
    h = hashlib.sha256()
    try:
        with open(r[4], "rb") as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
    except OSError:
        out.write(b"@ERR a file vanished or is unreadable while it was being checksummed\n")
        sys.exit(0)
    r[3] = h.hexdigest().encode()
for key, _, stamp, sha, _ in rows:
    out.write(b"F\t%s\t%s\t%s\n" % (stamp, sha, key))
token, _, rest = sys.argv[5].partition(" ")
if lazy and token:  # the listed files follow, hashed as they are read
    rate, _, source = rest.partition(" ")
    out.write(b"@STREAM %s\n" % token.encode())
    stream = {"__name__": "tb_stream"}
    exec(source, stream)
    stream["send"]([r[4] for r in todo], float(rate or 0), out)'

tb_files_sh() {  # the same without python3: stat and sha256sum, the known checksums parsed in bash
  local kl kstamp ksha kpath now odd=0
  mapfile -t tb_klines < <(printf '%s' "$tb_known")
  for kl in "${tb_klines[@]}"; do  # size<TAB>mtime<TAB>ctime_ns<TAB>inode<TAB>sha256<TAB>path
    if [[ $kl =~ ^([0-9]+)$'\t'(-?[0-9]+)$'\t'([0-9]+)$'\t'([0-9]+)$'\t'([0-9a-f]{64})$'\t'(.+)$ ]]; then
      kstamp="${BASH_REMATCH[1]} ${BASH_REMATCH[2]} ${BASH_REMATCH[3]} ${BASH_REMATCH[4]}"
      ksha=${BASH_REMATCH[5]}
      kpath=${BASH_REMATCH[6]}
      K["$kpath"]="$kstamp $ksha"
    fi
  done
  now=${EPOCHREALTIME-}  # the clock before the stat (bash 5: s.us; else date's ns; neither: not said)
  if [[ $now =~ ^([0-9]+)[.,]([0-9]{6})$ ]]; then
    now=${BASH_REMATCH[1]}${BASH_REMATCH[2]}000
  else
    now=$(date +%s%N 2> /dev/null)
  fi
  [[ $now =~ ^[0-9]+$ ]] && echo "@NOW $now"
  mapfile -t S < <(for f in "${files[@]}"; do printf '%s\0' "${tb_src[$f]}"; done |
    xargs -0 stat -L -c '%s %Y %.9Z %i' --)
  for i in "${!S[@]}"; do  # "size mtime ctime_ns inode" ("-" for a ctime this stat gives without its ns)
    if [[ ${S[i]} =~ ^([0-9]+\ -?[0-9]+\ )([0-9]+)\.([0-9]{9})(\ [0-9]+)$ ]]; then
      S[i]="${BASH_REMATCH[1]}$((10#${BASH_REMATCH[2]}${BASH_REMATCH[3]}))${BASH_REMATCH[4]}"
    elif [[ ${S[i]} =~ ^([0-9]+\ -?[0-9]+\ )[^\ ]*(\ [0-9]+)$ ]]; then
      S[i]="${BASH_REMATCH[1]}-${BASH_REMATCH[2]}"
    else
      odd=1  # never a file left out of the listing unsaid
    fi
  done
  declare -a Hm=() todo=()
  if [[ ${#S[@]} -eq ${#files[@]} ]]; then
    for i in "${!files[@]}"; do
      k=${K[${files[i]}]-}
      if [[ -n $k && "${k% *}" == "${S[i]}" ]]; then Hm[i]=${k##* }; else todo+=("$i"); fi
    done
    if ((${#todo[@]})); then
      mapfile -t H < <(for i in "${todo[@]}"; do printf '%s\0' "${tb_src[${files[i]}]}"; done | tb_hash)
      if [[ ${#H[@]} -eq ${#todo[@]} ]]; then
        j=0
        for i in "${todo[@]}"; do Hm[i]=${H[j]}; j=$((j + 1)); done
      fi
    fi
  fi
  if [[ $odd -ne 0 || ${#S[@]} -ne ${#files[@]} || ${#Hm[@]} -ne ${#files[@]} ]]; then
    echo "@ERR a file vanished or is unreadable while it was being checksummed"
  else
    for i in "${!files[@]}"; do
      printf 'F\t%s\t%s\t%s\n' "${S[i]// /$'\t'}" "${Hm[i]}" "${files[i]}"
    done
  fi
}

tb_ref_file() {  # files outside the run folder count only when written since the run folder was made
  if [[ -z ${tb_ref-} ]]; then
    tb_mktemp
    tb_ref=$tb_tmp/ref
    tb_since=$(stat -c %Z tb-rank.sh 2> /dev/null || echo 0)  # the run folder is the working directory
    touch -d "@$((tb_since - 2))" "$tb_ref" 2> /dev/null || touch -t 197001010000 "$tb_ref"
  fi
}

add() {  # a matched path -> its place in the results folder: run-relative, @home/..., @root/...
  case "$1" in *$'\n'*) echo "@NOTE skipped a file with a newline in its name"; return ;; esac
  if [[ $kind != run && -n ${tb_pristine[$1]+x} ]]; then pr=$((pr + 1)); return 1; fi
  local f="${1#./}"
  case "$kind" in
    home) f="@home/${f#"$HOME"/}" ;;
    root) f="@root$f" ;;
    *) case "$f" in @home/* | @root/*)
         echo "@NOTE skipped $f: @home/ and @root/ hold the files from outside the run folder"; return ;;
       esac ;;
  esac
  if [[ -z "${seen[$f]+x}" ]]; then seen[$f]=1; tb_src["$f"]=$1; files+=("$f"); fi
}

list_py() {  # the globs expanded here, everything else in one python3 (TB_LIST_PY)
  local pat kind glob
  {
    printf '%s\0' "$tb_known"
    for pat in "$@"; do
      case "$pat" in \~/*) kind=home; glob="${pat#\~/}" ;; /*) kind=root; glob=$pat ;; *) kind=run; glob=$pat ;; esac
      IFS=$'\n'
      # shellcheck disable=SC2206  # the pattern is expanded as a glob on purpose (IFS: only newlines split)
      if [[ $kind == home ]]; then ms=("$HOME"/$glob); else ms=($glob); fi
      unset IFS
      printf 'P\0%s\0%s\0' "$kind" "$pat"
      ((${#ms[@]} == 0)) || printf 'M\0%s\0' "${ms[@]}"
    done
  } | python3 -S -c "$TB_LIST_PY" "$HOME" "$tb_lazy_n" "$tb_lazy_b" "$tb_sources" "$tb_stream" "$tb_budget $tb_until" ||
    echo "@ERR a file vanished or is unreadable while it was being checksummed"  # never a silently missing file
}

list() {
  echo "@DIR $PWD"
  echo "@HOME $HOME"
  if command -v rsync > /dev/null 2>&1; then echo "@RSYNC 1"; else echo "@RSYNC 0"; fi
  shopt -s nullglob dotglob globstar
  if command -v python3 > /dev/null 2>&1; then
    list_py "$@"
    return
  fi
  declare -gA seen=() K=() tb_src=() tb_pristine=()
  files=()
  while IFS= read -r tb_s; do  # tracked and unchanged in a source checkout: the artifact's files, not outputs
    case $tb_s in \~) tb_s=$HOME ;; \~/*) tb_s=$HOME/${tb_s#\~/} ;; esac
    [[ -n $tb_s && -d $tb_s/.git ]] || continue
    unset tb_mod
    declare -A tb_mod=()
    while IFS= read -r -d '' x; do tb_mod["$x"]=1; done < <(git -C "$tb_s" ls-files -m -z 2> /dev/null)
    while IFS= read -r -d '' x; do
      [[ -n ${tb_mod[$x]+x} ]] || tb_pristine["$tb_s/$x"]=1
    done < <(git -C "$tb_s" ls-files -z 2> /dev/null)
  done < <(printf '%s\n' "$tb_sources")
  for pat in "$@"; do
    n=0
    old=0
    pr=0
    case "$pat" in \~/*) kind=home; glob="${pat#\~/}" ;; /*) kind=root; glob=$pat ;; *) kind=run; glob=$pat ;; esac
    IFS=$'\n'
    # shellcheck disable=SC2206  # the pattern is expanded as a glob on purpose (IFS: only newlines split)
    if [[ $kind == home ]]; then ms=("$HOME"/$glob); else ms=($glob); fi
    unset IFS
    for m in "${ms[@]}"; do
      if [[ -d $m ]]; then
        newer=()
        [[ $kind == run ]] || { tb_ref_file; newer=(-newer "$tb_ref"); }
        mapfile -d '' -t found < <(find "$m" -type f "${newer[@]}" -print0 2> /dev/null)  # no symlink followed
        for x in "${found[@]}"; do
          add "$x" && n=$((n + 1))
        done
      elif [[ -f $m ]]; then
        [[ $kind == run ]] || tb_ref_file
        if [[ $kind == run || $m -nt $tb_ref ]]; then add "$m" && n=$((n + 1)); else old=$((old + 1)); fi
      fi
    done
    [[ $old -gt 0 ]] && printf '@NOTE %s: %s matching file(s) left out: not written during this run\n' "$pat" "$old"
    [[ $pr -gt 0 ]] && printf '@NOTE %s: %s matching file(s) left out: the source checkout holds them unchanged\n' \
      "$pat" "$pr"
    [[ $n -eq 0 && $old -eq 0 && $pr -eq 0 ]] && printf '@NOMATCH %s\n' "$pat"
  done
  ((${#files[@]})) || return 0
  tb_files_sh
}

tb_background_out() {
  wait "$tb_bg"
  cat "$tb_tmp/background"
}
if [[ -n $tb_background && -n $tb_stream ]]; then  # before the stream: the collector reads it as the files come
  tb_background_out
  tb_background=
fi
if cd -P -- "$tb_dir" 2> /dev/null; then list "$@"; else echo "@NODIR"; fi
[[ -z $tb_background ]] || tb_background_out
echo "@END"
