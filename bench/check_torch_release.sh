#!/usr/bin/env bash
# Check nandoctor against one torch release, in a throwaway environment.
#
# Usage: bench/check_torch_release.sh TORCH_VERSION [PATCH_FILE]
#   bench/check_torch_release.sh 2.9.1
#   bench/check_torch_release.sh 2.6.0 /tmp/compat_torch29.patch   # check a patch on top of HEAD
#
# LARGE DOWNLOAD: apart from the CPU build of 2.13.0 on this machine's disk, a torch release
# comes from PyPI as a CUDA build: several GB (5.5 GB in the venv for 2.9.1 on x86_64) and
# 3 to 10 minutes to install. Have about 7 GB free under ${TMPDIR:-/tmp}.
#
# Environment:
#   WORKDIR=DIR  work in DIR instead of a new temp dir; a venv already there (DIR/venv) with
#                the same torch is reused, so a second run downloads nothing. DIR is kept.
#   KEEP=1       keep the temp dir (venv and clone) and print its path; removed otherwise.
#   JOBS=N       pytest-xdist workers (default 2).
#   SHARED=DIR   the shared folder with cases/ and tools/ (default: ../shared beside this repo).
#
# What it does, in order:
#   1. a venv, then torch==TORCH_VERSION and nandoctor's dependencies in ONE pip command, so
#      pip cannot swap the torch under test for another;
#   2. a clone of this repo's committed HEAD (uncommitted edits are NOT checked), PATCH_FILE
#      applied to it if given, installed editable with --no-deps (pyproject's own torch bound
#      is reported, not applied), with ../shared beside it as the tests expect;
#   3. the public cases with shared/tools/score_cases.py, then the test suite (pytest -q -n JOBS).
# It prints one summary line per part, e.g.
#   torch: 2.9.1+cu128, installed in 154s; pyproject's "torch>=2.13" admits it: no
#   cases: 17 passed, 0 failed in 175s
#   tests: 490 passed, 4 skipped in 1858s
# and the full logs' paths. Exit status: 0 when cases and tests all pass, 1 when some fail,
# 2 when the setup itself failed.
set -uo pipefail

if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
VERSION=$1
PATCH_FILE=${2:-}
REPO=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED:-$(cd "$REPO/.." && pwd)/shared}
JOBS=${JOBS:-2}
DEPS=(typer rich pyyaml numpy pytest pytest-xdist pillow safetensors pyarrow h5py)

die() { echo "check_torch_release: $*" >&2; exit 2; }
[ -f "$SHARED/tools/score_cases.py" ] || die "no $SHARED/tools/score_cases.py (set SHARED=DIR)"
if [ -n "$PATCH_FILE" ]; then
  PATCH_FILE=$(cd "$(dirname "$PATCH_FILE")" && pwd)/$(basename "$PATCH_FILE")
  [ -f "$PATCH_FILE" ] || die "no patch file $PATCH_FILE"
fi

if [ -n "${WORKDIR:-}" ]; then
  WORK=$WORKDIR
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/nandoctor-torch-$VERSION.XXXXXX")
  if [ "${KEEP:-0}" != 1 ]; then
    trap 'rm -rf "$WORK"' EXIT
  fi
fi
PY=$WORK/venv/bin/python
LOGS=$WORK/logs
mkdir -p "$LOGS"

# -- 1. the environment ------------------------------------------------------------------
start=$SECONDS
if [ -x "$PY" ] && "$PY" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$VERSION')" 2>/dev/null; then
  how="reused"
else
  rm -rf "$WORK/venv"
  python3 -m venv "$WORK/venv" || die "python3 -m venv failed"
  "$PY" -m pip install -q "torch==$VERSION" "${DEPS[@]}" >"$LOGS/install.log" 2>&1 \
    || die "pip install torch==$VERSION failed (see $LOGS/install.log)"
  how="installed in $((SECONDS - start))s"
fi

# -- 2. the code under test --------------------------------------------------------------
rm -rf "$WORK/nandoctor"
git clone -q "$REPO" "$WORK/nandoctor" || die "git clone $REPO failed"
ln -sfn "$SHARED" "$WORK/shared"
if [ -n "$PATCH_FILE" ]; then
  git -C "$WORK/nandoctor" apply "$PATCH_FILE" || die "the patch does not apply to HEAD"
fi
# --no-deps: pyproject's torch bound must not pull another torch over the one under test.
"$PY" -m pip install -q --no-deps -e "$WORK/nandoctor" >>"$LOGS/install.log" 2>&1 \
  || die "pip install --no-deps -e failed (see $LOGS/install.log)"
cd "$WORK/nandoctor" || die "no clone"

torch_line=$("$PY" - <<'EOF'
import re, torch
from packaging.requirements import Requirement
try:
    import tomllib
    deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
except ImportError:  # Python 3.10: a plain scan is enough for one line
    deps = re.findall(r'"(torch[^"]*)"', open("pyproject.toml").read())
req = next((Requirement(d) for d in deps if Requirement(d).name == "torch"), None)
base = torch.__version__.split("+")[0]
admits = "no bound" if req is None else ("yes" if req.specifier.contains(base, prereleases=True) else "no")
print(f'{torch.__version__}; pyproject\'s "{req}" admits it: {admits}')
EOF
) || torch_line="(torch does not import: see $LOGS/install.log)"
torch_line="torch: ${torch_line%%;*}, $how;${torch_line#*;}"

# -- 3. the checks -----------------------------------------------------------------------
status=0
start=$SECONDS
"$PY" "$SHARED/tools/score_cases.py" "$SHARED/cases" --nandoctor "$PY -m nandoctor" --verbose \
  >"$LOGS/cases.log" 2>&1 || status=1
cases_line="cases: $(tail -n 1 "$LOGS/cases.log") in $((SECONDS - start))s"
grep -q '^[0-9]* passed, 0 failed$' <(tail -n 1 "$LOGS/cases.log") || status=1

start=$SECONDS
"$PY" -m pytest -q -n "$JOBS" -p no:cacheprovider -rfs >"$LOGS/tests.log" 2>&1 || status=1
summary=$(grep -E '^(=+ )?[0-9]+ [a-z]+.* in [0-9.]+s' "$LOGS/tests.log" | tail -n 1 \
  | sed -E 's/^=+ //; s/ =+$//; s/ in [0-9.]+s.*//')
tests_line="tests: ${summary:-no pytest summary line (killed or crashed: see the log)} in $((SECONDS - start))s"

echo "$torch_line"
echo "$cases_line"
echo "$tests_line"
grep '^FAIL ' "$LOGS/cases.log" | cut -c1-160 | sed 's/^/  case /'
grep -E '^(FAILED|ERROR) ' "$LOGS/tests.log" | cut -c1-160 | sed 's/^/  test /'
if [ -n "${WORKDIR:-}" ] || [ "${KEEP:-0}" = 1 ]; then
  echo "logs: $LOGS (venv and clone kept in $WORK)"
fi
exit $status
