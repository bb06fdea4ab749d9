#!/bin/sh
# testbed collect: the host's facts and the run's software, for the manifest
# (testbed.collect.manifest.facts_script builds the call, parse_fact_lines reads its output).
# usage: facts.sh [--host] [--python PYTHON] [-- NAME PATH ...]
#   --host           "@F key value" lines (hostname, cpu, cpus, memory_kb, os, kernel, arch) and
#                    "@G name, memory, driver" per NVIDIA GPU
#   --python PYTHON  "@P version executable" of PYTHON (python3 when PYTHON is not there) and "@Z line" per line
#                    of its pip freeze
#   NAME PATH        "@S NAME<TAB>commit" of the git checkout at PATH (empty when it is not one)
# "~" and "~/" at the start of PYTHON and PATH are $HOME.
tb_home() {
  case $1 in \~) printf '%s' "$HOME" ;; \~/*) printf '%s/%s' "$HOME" "${1#\~/}" ;; *) printf '%s' "$1" ;; esac
}
tb_host=0
tb_py=
while [ $# -gt 0 ]; do
  case $1 in
    --host) tb_host=1; shift ;;
    --python) [ $# -ge 2 ] || break; tb_py=${2:-python3}; shift 2 ;;
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
if [ -n "$tb_py" ]; then
  tb_py=$(tb_home "$tb_py")
  command -v "$tb_py" > /dev/null 2>&1 || tb_py=python3
  if command -v "$tb_py" > /dev/null 2>&1; then
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
