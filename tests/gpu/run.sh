#!/usr/bin/env bash
# The GPU check, on a bare machine with an NVIDIA GPU, Python, torch with CUDA, and no Docker or
# package registry: installs what the carry folder holds into a throwaway virtualenv (offline),
# unpacks the wheel's tritonserver, and runs tests/gpu/check.py, which prints the report.
#
#   python -m tests.gpu.prepare            # once, where PyPI is reachable: fills tests/gpu/carry
#   tests/gpu/run.sh                       # on the GPU machine (about 3 minutes)
#
# `--device cpu` runs every step on a CPU instance instead; make test does that
# (tests/functional/test_gpu_check.py) so the script keeps working where no GPU is.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
carry=$here/carry
python=python3
check_args=()

usage() {
  cat <<EOF
usage: tests/gpu/run.sh [--carry DIR] [--python PYTHON] [--device gpu|cpu]
                        [--clients 1,4,16,64] [--seconds N] [--tolerance X] [--report FILE]

  --carry DIR      what python -m tests.gpu.prepare wrote (default: tests/gpu/carry)
  --python PYTHON  the interpreter whose site-packages hold torch (default: python3); its
                   X.Y must be the one the carry was prepared for
  --device         gpu (default) or cpu; --clients, --seconds, --tolerance, --report: passed to
                   tests/gpu/check.py (see its docstring)
EOF
}

fail() {
  echo "tests/gpu/run.sh: $*" >&2
  exit 2
}

while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --carry | --python | --device | --clients | --seconds | --tolerance | --report)
      (($# >= 2)) || fail "$1 needs a value (see --help)"
      case $1 in
        --carry) carry=$2 ;;
        --python) python=$2 ;;
        *) check_args+=("$1" "$2") ;;
      esac
      shift 2
      ;;
    *) fail "unknown argument '$1' (see --help)" ;;
  esac
done

[[ -f $carry/MANIFEST.json ]] ||
  fail "$carry has no MANIFEST.json: run 'python -m tests.gpu.prepare' where PyPI is reachable"
command -v "$python" >/dev/null || fail "no interpreter '$python' (pass --python)"
have=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
want=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["python"])' \
  "$carry/MANIFEST.json")
[[ $have == "$want" ]] ||
  fail "$python is Python $have, the carry is for $want: prepare it with --python $have"

# The wheel's Python backend stub links libpython X.Y as a shared library; an interpreter built
# without one (--enable-shared off) cannot host it, and would fail only at model load.
"$python" - <<'EOF' || fail "$python has no shared libpython (built without --enable-shared): the Python backend stub needs one; use the system's or conda's Python"
import os, sys, sysconfig
name = sysconfig.get_config_var("LDLIBRARY") or ""
libdir = sysconfig.get_config_var("LIBDIR") or ""
sys.exit(0 if name.endswith(".so") or os.path.exists(os.path.join(libdir, name.replace(".a", ".so"))) else 1)
EOF

echo "gpu check: verifying the carry" >&2
bad=$("$python" - "$carry" <<'EOF'
import hashlib, json, sys
from pathlib import Path
carry = Path(sys.argv[1])
for name, entry in json.loads((carry / "MANIFEST.json").read_text())["files"].items():
    path = carry / name
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
        print(path)
        sys.exit(1)
EOF
) || fail "$bad is missing or not the file prepare wrote: prepare the carry again"

work=$(mktemp -d "${TMPDIR:-/tmp}/tritonstack-gpu-run.XXXXXX")
pip=("$work/venv/bin/python" -m pip)
trap 'rm -rf "$work"' EXIT

echo "gpu check: installing offline into $work/venv" >&2
# --system-site-packages: torch is the machine's own, built for its CUDA. The carried numpy 1
# goes in front of the machine's: the wheel's Python backend stub needs numpy 1 (prepare.py).
if ! "$python" -m venv --system-site-packages "$work/venv" >/dev/null 2>&1; then
  # No ensurepip (Debian's python3 without python3-venv): a venv without pip, filled by the
  # interpreter's own pip.
  "$python" -m venv --clear --system-site-packages --without-pip "$work/venv" ||
    fail "$python cannot make a virtualenv (python -m venv)"
  pip=("$python" -m pip --python "$work/venv/bin/python")
fi
mapfile -t requirements < <("$python" -c \
  'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["requirements"]))' \
  "$carry/MANIFEST.json")
"${pip[@]}" install --quiet --disable-pip-version-check --no-index \
  --find-links "$carry/wheels" "${requirements[@]}" ||
  fail "pip could not install ${requirements[*]} from $carry/wheels alone: prepare it again"

echo "gpu check: unpacking tritonserver" >&2
mkdir "$work/runtime"
tar -xJf "$carry/tritonserver-runtime.tar.xz" -C "$work/runtime"

cd "$root"
status=0
"$work/venv/bin/python" tests/gpu/check.py --runtime "$work/runtime" "${check_args[@]}" || status=$?
exit "$status"
