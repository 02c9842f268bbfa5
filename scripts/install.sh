#!/usr/bin/env bash
# Creates .venv/ in the repository root from requirements/lock.txt.
#
# Idempotent: a stamp file holds the SHA-256 of the lock (and of this script);
# when it matches, nothing is done. Any interpreter in PYTHON (default
# python3.11, then python3) must be CPython 3.11, which TFF 0.87 requires.
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=requirements/lock.txt
VENV=.venv
STAMP="$VENV/.tff_pfl_lock.sha256"
want="$(cat "$LOCK" scripts/install.sh | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/python" ]]; then
  exit 0
fi
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
fi
ver="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ "$ver" != "3.11" ]]; then
  echo "install.sh: TensorFlow Federated 0.87 needs Python 3.11, but $PY is $ver." >&2
  echo "Set PYTHON=/path/to/python3.11 and run again." >&2
  exit 1
fi
echo "install.sh: creating $VENV from $LOCK (a cold install takes a few minutes)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip==24.0 2>&1 | grep -v "^WARNING: Location" || true
# --no-deps: the lock is complete; TFF's own metadata asks for jax 0.4.14,
# which cannot be resolved here (BUILD_NOTES.md).
"$VENV/bin/python" -m pip install -q --no-deps -r "$LOCK" 2>&1 \
  | grep -v "^WARNING: Location" || true
# Through tff_pfl.core.runtime: it collects TFF's ServiceManager at exit, so
# the check does not end on TFF's "'NoneType' object has no attribute
# 'Popen'" teardown noise (BUILD_NOTES.md).
"$VENV/bin/python" -c "import tff_pfl.core.runtime, tensorflow_federated as tff, tensorflow as tf, sklearn, matplotlib; print('install.sh: TFF', tff.__version__, 'TF', tf.__version__)"
echo "$want" > "$STAMP"
