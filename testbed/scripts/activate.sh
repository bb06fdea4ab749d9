# shellcheck shell=sh
# testbed run: enter the suite's environment at $tb_env (set just before this text by
# testbed.run.ranks.activate, which puts it at the top of step and rank scripts), or fail with exit status 96
# (testbed.run.ranks.ENV_MISSING) saying so.
# A venv is entered with its own bin/activate; a conda env (no bin/activate of its own) by putting its bin first
# on PATH, setting CONDA_PREFIX and sourcing its etc/conda/activate.d scripts, which is what `conda activate`
# does without needing conda's shell hook on the host.
tb_env=${tb_env:?}
if [ ! -d "$tb_env/bin" ]; then
  echo "testbed: the suite's environment $tb_env does not exist on $(hostname); apply the suite's profile" \
    "(testbed setup ... --suite ...) or fix 'environment:' in the suite" >&2
  exit 96
fi
if [ -f "$tb_env/bin/activate" ] && [ ! -d "$tb_env/conda-meta" ]; then
  # shellcheck disable=SC1091  # the environment's own script, on the host
  . "$tb_env/bin/activate"
else
  PATH="$tb_env/bin:$PATH"
  CONDA_PREFIX="$tb_env"
  CONDA_DEFAULT_ENV="$tb_env"
  export PATH CONDA_PREFIX CONDA_DEFAULT_ENV
  for tb_f in "$tb_env"/etc/conda/activate.d/*.sh; do
    # shellcheck disable=SC1090  # the environment's own scripts, on the host
    [ -f "$tb_f" ] && . "$tb_f"
  done
fi
