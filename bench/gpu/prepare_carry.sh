#!/usr/bin/env bash
# Stage what bench/gpu/run.sh needs on the GPU machine (no network there), in this checkout, ignored by git:
#   .whl/                      ansible-core and deepspeed with what the GPU image lacks, and GPUtil
#   bench/gpu/carry/artifacts/ Scalable_ViT_DT, open-jitc and NeuronaBox-NCCL from ../shared/artifacts
# Run here (with network), from the repository root:  bash bench/gpu/prepare_carry.sh [SHARED_ARTIFACTS]
# BUILD_PY: a Python that imports torch (deepspeed's setup.py imports it to build its pure wheel).
set -euo pipefail
cd "$(dirname "$0")/../.."
src=${1:-../shared/artifacts}
[ -d "$src" ] || src=/work/shared/artifacts
build_py=${BUILD_PY:-python3}
pip_dl=(python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl)

mkdir -p .whl bench/gpu/carry/artifacts
# ansible-core 2.19 (pure Python); the GPU image has jinja2, pyyaml, packaging, markupsafe
"${pip_dl[@]}" 'ansible-core==2.19.*' 'resolvelib<2' cryptography cffi pycparser
# deepspeed's requirements the GPU image lacks (it has einops, msgpack, ninja, numpy, packaging, psutil,
# py-cpuinfo, torch, tqdm; typing-extensions too, but pydantic may need a newer one)
"${pip_dl[@]}" hjson 'pydantic>=2' pydantic-core annotated-types typing-inspection \
  typing-extensions
# pydantic pins pydantic-core exactly: fetch the one it names
pc=$(unzip -p .whl/pydantic-[0-9]*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
if [ -n "$pc" ]; then rm -f .whl/pydantic_core-*.whl; "${pip_dl[@]}" "pydantic-core==$pc"; fi
# deepspeed and GPUtil are sdists only on PyPI: build their pure-Python wheels here
# (GPUtil's setup.py needs the 'wheel' package for bdist_wheel without build isolation)
"$build_py" -m pip install -q wheel
tmp=$(mktemp -d)
python3 -m pip download --no-deps --no-binary=:all: -d "$tmp" 'deepspeed==0.19.*' GPUtil==1.4.0
for s in "$tmp"/*.tar.gz; do
  DS_BUILD_OPS=0 "$build_py" -m pip wheel -q --no-deps --no-build-isolation -w .whl "$s"
done
rm -rf "$tmp"

for a in Scalable_ViT_DT open-jitc NeuronaBox-NCCL; do cp -f "$src/$a.tar.gz" bench/gpu/carry/artifacts/; done
chmod -R u+w bench/gpu/carry/artifacts
ls -la .whl bench/gpu/carry/artifacts
du -cb .whl bench/gpu/carry/artifacts | tail -n 1 | awk '{printf "carried: %.1f MiB (limit 64 MiB with the working tree)\n", $1/1048576}'
