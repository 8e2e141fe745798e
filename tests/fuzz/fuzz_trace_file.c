/* fuzz_trace_file - libFuzzer harness for mpbench's trace file reader
 * (mpb_trace_load in bench/core/trace.c: the bounded read, its line scan
 * and header check, then the parser). The input, with the header in front
 * half of the time, is written to a scratch file and loaded. The result
 * must be a workload that ends empty or a refusal naming the file, and the
 * file reader must decide as the buffer parser does on the same bytes: it
 * may stop reading early, never decide otherwise. */
#include "fuzz_workload.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t len;
  char *text = fz_with_header(data, size, FZ_TRACE_HEADER, &len);
  if (text == NULL)
    return 0;
  const char *path = fz_file(text, len);
  FZ_REQUIRE(path != NULL);
  mpb_workload_t w, wp;
  mp_status_t st = mpb_trace_load(path, "fuzz", &w);
  size_t n = st == MP_OK ? w.n : 0;
  fz_workload_ok(st, &w, path);
  mp_status_t sp = mpb_trace_parse(text, len, "fuzz.csv", "fuzz", &wp);
  FZ_REQUIRE((st == MP_OK) == (sp == MP_OK));
  FZ_REQUIRE(sp != MP_OK || wp.n == n);
  fz_workload_ok(sp, &wp, "fuzz.csv");
  free(text);
  return 0;
}
