#!/usr/bin/env bash
# tests/run.sh - the README's test command: installs what is missing,
# configures, builds and runs every test with ctest.
#   tests/run.sh                              plain build in build/
#   tests/run.sh --sanitize address,undefined ASan+UBSan build in build-asan/
#   tests/run.sh --sanitize thread            TSan build in build-tsan/
#   tests/run.sh --debug                      Debug build in build-debug/:
#                                             -O0, MEMPOOL_ASSERT on (MP__ASSERT)
# Extra arguments after -- go to ctest (e.g. -- -L unit).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../cmake/deps.sh
. "$root/cmake/deps.sh"

sanitize=""
type=RelWithDebInfo
build="$root/build"
while [ $# -gt 0 ]; do
  case "$1" in
  --sanitize)
    sanitize="${2:?--sanitize needs address,undefined or thread}"
    shift 2
    ;;
  --debug)
    type=Debug
    shift
    ;;
  --) shift; break ;;
  -h | --help)
    sed -n '2,10p' "$0"
    exit 0
    ;;
  *) echo "tests/run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$sanitize" in
"") ;;
thread) build="$root/build-tsan" ;;
address* | undefined*) build="$root/build-asan" ;;
*) echo "tests/run.sh: bad --sanitize '$sanitize'" >&2; exit 2 ;;
esac
[ "$type" != Debug ] || build="$build-debug"

mempool_deps
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="$type" \
  -DMEMPOOL_SANITIZE="$sanitize" -DMEMPOOL_WERROR=ON
cmake --build "$build" -j "$jobs"
if [ -n "$sanitize" ]; then
  # Sanitizer reports must fail the run, not scroll past.
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
  export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
fi
cd "$build"
ctest --output-on-failure -j "$jobs" "$@"
