#!/usr/bin/env bash
# defrag_kv_seqs_fit_check.sh BIN_DIR - bench_defrag_kv refuses (exit 2,
# with a message naming --seqs) a sequence count whose first step cannot
# fit in the device: every sequence holds a 16-token cache at once there.
# --seqs 4000000000 was taken and ran for minutes setting up 128 GB of
# sequences on the host. A count that fits still runs and exits 0.
set -u
run=$1/bench_defrag_kv
status=0
refused() { # ARGS...: must exit 2 within 20 s, naming --seqs
  local err rc
  err=$(timeout 20 "$run" "$@" 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" -ne 2 ] || ! grep -q -- '--seqs' <<<"$err"; then
    printf 'defrag_kv_seqs_fit_check: FAIL: %s exited %s:\n%s\n' "$*" "$rc" \
      "$err"
    status=1
  fi
}
# 4e9 caches of 128 KiB on the default 8 GiB device.
refused --seqs 4000000000 --steps 1
# 1024 caches of 128 KiB: 128 MiB, twice the device.
refused --device host:capacity=64M --seqs 1024 --steps 3
# 256 of them: half the device.
out=$(timeout 60 "$run" --device host:capacity=64M --seqs 256 --steps 3 2>&1)
rc=$?
if [ "$rc" -ne 0 ]; then
  printf 'defrag_kv_seqs_fit_check: FAIL: 256 sequences exited %s:\n%s\n' \
    "$rc" "$out"
  status=1
fi
[ "$status" -eq 0 ] && echo "defrag_kv_seqs_fit_check: ok"
exit "$status"
