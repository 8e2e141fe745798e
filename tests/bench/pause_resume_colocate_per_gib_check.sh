#!/usr/bin/env bash
# pause_resume_colocate_per_gib_check.sh BIN_DIR - bench_pause_resume's
# colocate line divides a round trip's time by the GiB it moves. With two
# 1 GiB pools a round trip pauses and resumes each once: 1 GiB out and
# 1 GiB back per pool, 4 GiB, each way counted as the table counts one
# pause or one resume. It divided by 2, so its "ms per GiB moved" was
# twice the time per GiB the table's pauses and resumes show. Run with
# pools of 64 MiB (256 MiB moved a round trip, a quarter of a GiB): with
# 1 GiB pools the first touch of 8 GiB of pages took 68 to 280 s on a
# loaded 2-core machine whose page faults are slow, and ran out of time.
set -u
out=$(timeout 280 "$1/bench_pause_resume" 64M 1 2>&1)
rc=$?
line=$(grep '^colocate:' <<<"$out")
trip=$(sed -n 's/.* \([0-9.]*\) ms per round trip.*/\1/p' <<<"$line")
per_gib=$(sed -n 's/.* \([0-9.]*\) ms per GiB moved.*/\1/p' <<<"$line")
# Both printed to 0.1 ms: per_gib / 4 within 0.25 ms of the round trip.
if [ "$rc" -ne 0 ] || [ -z "$trip" ] || [ -z "$per_gib" ] ||
  ! grep -q '(256 MiB moved:' <<<"$line" ||
  ! awk -v t="$trip" -v g="$per_gib" \
    'BEGIN { d = g / 4 - t; exit !(d < 0.25 && d > -0.25) }'; then
  printf 'pause_resume_colocate_per_gib_check: FAIL: exit %s, 256 MiB a ' "$rc"
  printf 'round trip, but:\n%s\n' "$out"
  exit 1
fi
echo "pause_resume_colocate_per_gib_check: ok ($line)"
