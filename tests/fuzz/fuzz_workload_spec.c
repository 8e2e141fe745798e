/* fuzz_workload_spec - libFuzzer harness for mpbench's workload specs
 * ("llm:key=val,...", mpb_workload_check in bench/core/workload.c: the
 * built-in name, then each parameter's name, syntax and range). Generating
 * the workload is not fuzzed: its cost grows with the parameters by design
 * (their ranges allow billions of events). A refused spec says why; an
 * accepted one is refused with its parameters given twice, and with an
 * unknown parameter added, naming it. */
#include "fuzz_workload.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char buf[256];
  const char *spec = fz_cstr(data, size, buf, sizeof buf);
  mp_status_t st = mpb_workload_check(spec);
  if (st != MP_OK) {
    fz_refused(st, NULL);
    return 0;
  }
  /* Items join with ',' unless the list is empty ("llm:" is accepted). */
  char more[2 * sizeof buf + 16];
  const char *colon = strchr(spec, ':');
  bool empty = colon == NULL || colon[1] == '\0';
  snprintf(more, sizeof more, "%s%sfz_unknown=1", spec,
           colon == NULL ? ":"
           : empty       ? ""
                         : ",");
  FZ_REQUIRE(mpb_workload_check(more) == MP_EINVAL);
  FZ_REQUIRE(strstr(mp_last_error(), "fz_unknown") != NULL);
  if (!empty) {
    snprintf(more, sizeof more, "%s,%s", spec, colon + 1);
    FZ_REQUIRE(mpb_workload_check(more) == MP_EINVAL);
    FZ_REQUIRE(strstr(mp_last_error(), "given twice") != NULL);
  }
  return 0;
}
