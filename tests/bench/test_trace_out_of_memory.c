/* A trace that runs the host out of memory is refused with the line it was
 * read at and the cause, whichever of the parser's maps could not grow: the
 * streams' map gave a bare MP_ENOMEM, and the message quoted whatever
 * failure the thread had before (an unrelated one, or none). */
#include <criterion/criterion.h>
#include <string.h>

#include "internal.h"
#include "mpbench.h"

#define HEADER "Thread,Time,Action,Pointer,Size,Stream\n"

Test(trace_out_of_memory, a_streams_map_that_cannot_grow_names_itself) {
  const char *csv = HEADER "1,00:00:00.1,allocate,0x1000,100,7\n";
  mp__fail(MP_EINVAL, "an older failure of this thread");
  mpb_workload_t w;
  /* The row's first host allocation (the addresses' map) is made; the
   * next (the streams' map) fails. */
  mp__fault_host_after(1);
  mp_status_t st = mpb_trace_parse(csv, strlen(csv), "t.csv", "t", &w);
  mp__fault_host_after(-1);
  cr_assert_eq(st, MP_ENOMEM, "%s", mp_last_error());
  const char *msg = mp_last_error();
  cr_expect(strstr(msg, "t.csv:2: trace too big for host memory") != NULL, "%s",
            msg);
  cr_expect(strstr(msg, "older failure") == NULL, "a stale cause: %s", msg);
  cr_expect(strstr(msg, "stream") != NULL, "the cause is not named: %s", msg);
  cr_expect_eq(w.n, 0);
  cr_expect_null(w.ev);
}
