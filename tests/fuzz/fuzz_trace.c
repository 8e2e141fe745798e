/* fuzz_trace - libFuzzer harness for mpbench's RMM-CSV trace reader
 * (bench/core/trace.c). Inputs get the header put in front half of the
 * time, so that mutations reach the rows. Each result must be a workload
 * that ends empty (every allocation freed, live bytes back to 0), or a
 * refusal with a message that names the input and leaves nothing behind. */
#include "fuzz_workload.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t len;
  char *text = fz_with_header(data, size, FZ_TRACE_HEADER, &len);
  if (text == NULL)
    return 0;
  mpb_workload_t w;
  mp_status_t st = mpb_trace_parse(text, len, "fuzz.csv", "fuzz", &w);
  fz_workload_ok(st, &w, "fuzz.csv");
  free(text);
  return 0;
}
