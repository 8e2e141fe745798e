#!/usr/bin/env bash
# cmake/deps.sh - install what building and testing mempool needs, only what
# is missing, from Debian's packages. Sourced by tests/run.sh and
# bench/run.sh; safe to run again (it does nothing when all is present).
# python3-pytest/pip/setuptools: the Python package's tests (python/);
# chromium: report.html's test in headless Chromium; minisat: the exact
# offline placement (bench/tools/exact_pack.py) and its test; locales: the
# de_DE sources the locale tests make a comma-decimal locale from.
#   mempool_deps [extra-package...]
mempool_deps() {
  local want=(cmake make gcc pkg-config libcriterion-dev libjemalloc-dev
    python3 python3-pytest python3-pip python3-setuptools chromium minisat
    locales "$@")
  local missing=()
  local p
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "mempool: installing ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq &&
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
