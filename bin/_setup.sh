# Sourced by bin/demo, bin/test and .ci/run: a virtualenv in .venv with the pinned
# requirements, re-installed only when requirements.txt changes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

find_python() {
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "Countersign needs Python 3.11 or newer (python3.11 -m venv must work)." >&2
  return 1
}

if [ ! -x .venv/bin/python ]; then
  echo "Creating the virtualenv in .venv ..."
  "$(find_python)" -m venv .venv
fi
stamp=.venv/.requirements.sha256
wanted=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "Installing requirements.txt into .venv ..."
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
  echo "$wanted" > "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
