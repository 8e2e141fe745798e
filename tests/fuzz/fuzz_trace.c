/* fuzz_trace - libFuzzer harness for mpbench's RMM-CSV trace reader
 * (bench/core/trace.c). Inputs get the header put in front half of the
 * time, so that mutations reach the rows. Each result must be a workload
 * that ends empty (every allocation freed, live bytes back to 0), or a
 * refusal with a message that names the input and leaves nothing behind. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

#include "fuzz_require.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char HEADER[] = "Thread,Time,Action,Pointer,Size,Stream\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  bool with_header = size > 0 && (data[0] & 1);
  size_t hl = with_header ? sizeof HEADER - 1 : 0;
  char *text = malloc(hl + size + 1);
  if (text == NULL)
    return 0;
  memcpy(text, HEADER, hl);
  if (size > 0)
    memcpy(text + hl, data + (with_header ? 1 : 0),
           size - (with_header ? 1 : 0));
  size_t len = hl + size - (with_header ? 1 : 0);
  mpb_workload_t w;
  mp_status_t st = mpb_trace_parse(text, len, "fuzz.csv", "fuzz", &w);
  if (st == MP_OK) {
    size_t live = 0;
    for (size_t i = 0; i < w.n; i++) {
      if (w.ev[i].op == MPB_ALLOC) {
        live += w.ev[i].size;
      } else {
        FZ_REQUIRE(w.ev[i].op == MPB_FREE);
        FZ_REQUIRE(live >= w.ev[i].size);
        live -= w.ev[i].size;
      }
    }
    FZ_REQUIRE(live == 0);
    mpb_workload_free(&w);
  } else {
    FZ_REQUIRE(st == MP_EINVAL || st == MP_ENOMEM);
    FZ_REQUIRE(strstr(mp_last_error(), "fuzz.csv") != NULL);
    FZ_REQUIRE(w.n == 0 && w.ev == NULL);
  }
  free(text);
  return 0;
}
