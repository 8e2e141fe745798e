/* fuzz_workload.h - the check the mpbench reader harnesses share: a parsed
 * workload ends empty (every allocation freed, live bytes back to 0); a
 * refusal says why (naming `names`, the input's name, when not NULL) and
 * leaves the workload empty. Frees the workload. */
#ifndef MEMPOOL_FUZZ_WORKLOAD_H
#define MEMPOOL_FUZZ_WORKLOAD_H

#include "mpbench.h"

#include "fuzz_require.h"

/* API.md's trace header, put in front of half the inputs. */
#define FZ_TRACE_HEADER "Thread,Time,Action,Pointer,Size,Stream\n"

static inline void fz_workload_ok(mp_status_t st, mpb_workload_t *w,
                                  const char *names) {
  if (st == MP_OK) {
    size_t live = 0;
    for (size_t i = 0; i < w->n; i++) {
      if (w->ev[i].op == MPB_ALLOC) {
        live += w->ev[i].size;
      } else {
        FZ_REQUIRE(w->ev[i].op == MPB_FREE);
        FZ_REQUIRE(live >= w->ev[i].size);
        live -= w->ev[i].size;
      }
    }
    FZ_REQUIRE(live == 0);
    mpb_workload_free(w);
  } else {
    fz_refused(st, names);
    FZ_REQUIRE(w->n == 0 && w->ev == NULL);
  }
}

#endif /* MEMPOOL_FUZZ_WORKLOAD_H */
