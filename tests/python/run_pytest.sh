#!/bin/sh
# run_pytest.sh PYTHON TESTDIR - runs the Python package's pytest suite for
# ctest. pytest's exit status 5 ("no tests were collected") is a failure
# here with its own message: a suite that vanished must not pass.
py="$1"
dir="$2"
if ! "$py" -c "import pytest" 2>/dev/null; then
  echo "run_pytest.sh: $py has no pytest; install python3-pytest (cmake/deps.sh does)" >&2
  exit 1
fi
"$py" -m pytest -q -p no:cacheprovider "$dir"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run_pytest.sh: pytest collected no tests in $dir" >&2
  exit 1
fi
exit "$rc"
