#!/bin/sh
# testbed collect: the host's facts and the run's software, for the manifest
# (testbed.collect.manifest.facts_script builds the call, parse_fact_lines reads its output).
# usage: facts.sh [--host] [--python PYTHON | --fingerprint PYTHON] [-- NAME PATH ...]
#   --host           "@F key value" lines (hostname, cpu, cpus, memory_kb, os, kernel, arch) and
#                    "@G name, memory, driver" per NVIDIA GPU
#   --python PYTHON  "@Y fingerprint" (as --fingerprint, taken first), "@P version executable" of PYTHON (python3
#                    when PYTHON is not there) and "@Z line" per line of its pip freeze
#   --fingerprint PYTHON  only "@Y fingerprint": a sha256 of what PYTHON's pip freeze and version depend on (the
#                    interpreter; inode, size, mtime and ctime of every folder on its path and site folders, of
#                    their .pth, .egg-link and *-info entries; HEAD, branch ref, packed-refs and config of the git
#                    checkout of every editable install); empty when PYTHON cannot run
#   NAME PATH        "@S NAME<TAB>commit" of the git checkout at PATH (empty when it is not one)
# "~" and "~/" at the start of PYTHON and PATH are $HOME.
# shellcheck disable=SC2016  # python source, not shell
TB_FP_PY='import hashlib, json, os, site, sys
h = hashlib.sha256(os.fsencode(sys.executable) + b" " + sys.version.encode() + b"\n")
done = set()
def add(p):
    if p in done:
        return
    done.add(p)
    try:
        st = os.stat(p)
    except OSError:
        h.update(p + b" -\n")
        return
    h.update(b"%s %d %d %d %d\n" % (p, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
def read(p):
    try:
        with open(p, "rb") as f:
            return f.read(1 << 20)
    except OSError:
        return b""
def git(p):  # pip freeze names an editable checkout by its commit and remote
    g = os.path.join(p, b".git")
    if os.path.isfile(g):  # a worktree: "gitdir: PATH"
        add(g)
        g = os.path.join(p, read(g).partition(b"gitdir:")[2].strip())
    common = os.path.join(g, read(os.path.join(g, b"commondir")).strip())
    head = read(os.path.join(g, b"HEAD")).strip()
    add(os.path.join(g, b"HEAD"))
    if head.startswith(b"ref: "):
        add(os.path.join(common, head[5:]))
    add(os.path.join(common, b"packed-refs"))
    add(os.path.join(common, b"config"))
def scan(d, depth):  # a folder on the path: itself and what decides what is installed there
    if d in done:
        return
    add(d)
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return
    for n in names:  # bounded: one folder listing, and .pth/.egg-link folders one level deep
        p = os.path.join(d, n)
        if n.endswith((b".dist-info", b".egg-info")):
            add(p)
            u = read(os.path.join(p, b"direct_url.json"))
            if u:
                try:
                    url = json.loads(u).get("url") or ""
                except ValueError:
                    url = ""
                if url.startswith("file://"):
                    from urllib.parse import unquote
                    git(os.fsencode(unquote(url[7:])))
        elif n.endswith(b".pth") and depth == 0:
            add(p)
            for ln in read(p).splitlines():
                ln = ln.strip()
                if ln and not ln.startswith((b"#", b"import ", b"import\t")):
                    scan(os.path.join(d, ln), 1)
        elif n.endswith(b".egg-link") and depth == 0:
            add(p)
            src = (read(p).splitlines() or [b""])[0].strip()
            if src:
                scan(os.path.join(d, src), 1)
                git(os.path.join(d, src))
add(os.fsencode(os.path.realpath(sys.executable)))
prefixes = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]
here = os.path.dirname(os.path.abspath(sys.executable))
for cfg in (os.path.join(here, "pyvenv.cfg"), os.path.join(os.path.dirname(here), "pyvenv.cfg")):
    if os.path.isfile(cfg):  # a virtual environment (-S leaves sys.prefix at its base)
        add(os.fsencode(cfg))
        prefixes.insert(0, os.path.dirname(cfg))
        break
ver = "python%d.%d" % sys.version_info[:2]  # the usual site folders too (some builds patch getsitepackages)
libs = (getattr(sys, "platlibdir", "lib"), "lib")
usual = [os.path.join(p, lib, ver, "site-packages") for p in prefixes for lib in libs]
for d in [*sys.path, *usual, *site.getsitepackages(prefixes), site.getusersitepackages()]:
    if d:
        scan(os.fsencode(os.path.abspath(d)), 0)
print(h.hexdigest())'
tb_home() {
  case $1 in \~) printf '%s' "$HOME" ;; \~/*) printf '%s/%s' "$HOME" "${1#\~/}" ;; *) printf '%s' "$1" ;; esac
}
tb_python() {  # PYTHON, or python3 when that one is not there; "" when neither is
  tb_p=$(tb_home "$1")
  command -v "$tb_p" > /dev/null 2>&1 || tb_p=python3
  command -v "$tb_p" > /dev/null 2>&1 || tb_p=
  printf '%s' "$tb_p"
}
tb_fingerprint() {
  printf '@Y %s\n' "$([ -z "$1" ] || "$1" -S -c "$TB_FP_PY" 2> /dev/null)"
}
tb_host=0
tb_py=
tb_fp=
while [ $# -gt 0 ]; do
  case $1 in
    --host) tb_host=1; shift ;;
    --python) [ $# -ge 2 ] || break; tb_py=${2:-python3}; shift 2 ;;
    --fingerprint) [ $# -ge 2 ] || break; tb_fp=${2:-python3}; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
if [ "$tb_host" = 1 ]; then
  printf '@F hostname %s\n' "$(hostname 2> /dev/null)"
  printf '@F cpu %s\n' "$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo 2> /dev/null | head -n1)"
  printf '@F cpus %s\n' "$(nproc 2> /dev/null || getconf _NPROCESSORS_ONLN)"
  printf '@F memory_kb %s\n' "$(awk '/^MemTotal:/{print $2}' /proc/meminfo 2> /dev/null)"
  # shellcheck disable=SC1091,SC2153  # the host's os-release defines PRETTY_NAME
  printf '@F os %s\n' "$( (. /etc/os-release 2> /dev/null && echo "$PRETTY_NAME") || uname -s)"
  printf '@F kernel %s\n' "$(uname -r)"
  printf '@F arch %s\n' "$(uname -m)"
  if command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2> /dev/null | sed 's/^/@G /'
  fi
fi
if [ -n "$tb_fp" ]; then
  tb_fingerprint "$(tb_python "$tb_fp")"
fi
if [ -n "$tb_py" ]; then
  tb_py=$(tb_python "$tb_py")
  tb_fingerprint "$tb_py"  # before the freeze: an install during it changes the next fingerprint
  if [ -n "$tb_py" ]; then
    printf '@P %s\n' "$("$tb_py" -c 'import platform, sys; print(platform.python_version(), sys.executable)' \
      2> /dev/null)"
    { "$tb_py" -m pip freeze --all 2> /dev/null || "$tb_py" -c 'import importlib.metadata as m
print("\n".join(sorted({d.metadata["Name"] + "==" + d.version for d in m.distributions() if d.metadata["Name"]})))' \
      2> /dev/null; } | sed 's/^/@Z /'
  fi
fi
while [ $# -ge 2 ]; do
  printf '@S %s\t%s\n' "$1" "$(git -C "$(tb_home "$2")" rev-parse HEAD 2> /dev/null)"
  shift 2
done
exit 0
