# Sourced by bin/demo, bin/test and .ci/run: a virtualenv in .venv with the pinned
# requirements, re-installed only when the requirements file changes. bin/test and .ci/run set
# COUNTERSIGN_REQUIREMENTS=requirements-dev.txt (the server's plus the client's extras).
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
requirements="${COUNTERSIGN_REQUIREMENTS:-requirements.txt}"
stamp=".venv/.${requirements%.txt}.sha256"
# The stamp covers every file the install reads, so a change to any of them re-installs.
wanted=$(cat "$requirements" requirements.txt client/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "Installing $requirements into .venv ..."
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$requirements"
  echo "$wanted" > "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
