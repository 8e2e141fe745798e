/* A trim or destroy the host pool refuses because a stream that used it is
 * being captured (waiting for it would put an event into the graph, or a
 * synchronize would invalidate the capture: cuda.h, cuStreamBeginCapture
 * and cuStreamQuery "not allowed during stream capture") says so as the
 * host pool's call, and what to do: call again once the capture has
 * ended. The device pool under it said "no mp_pool_destroy while ..." or
 * "no synchronize while ...", naming a call a host-pool user never made,
 * or none. */
#include <string.h>

#include "host_pool_capture.h"

/* A buffer used on a, freed, and a relaxed capture on a begun. */
static void setup(void) {
  hpc_setup();
  hpc_used_on(a);
  hpc_capture_begin();
}

static void teardown(void) {
  hpc_capture_end();
  hpc_teardown();
}

TestSuite(host_pool_capture_messages, .init = setup, .fini = teardown);

/* st is MP_EBUSY, said by fn, naming no device-pool call, and says to call
 * fn again once the capture has ended. */
static void said_by(mp_status_t st, const char *fn) {
  const char *m = mp_last_error();
  cr_assert_eq(st, MP_EBUSY, "%s", mp_status_name(st));
  cr_expect_eq(strncmp(m, fn, strlen(fn)), 0, "not said by %s: %s", fn, m);
  cr_expect_eq(m[strlen(fn)], ':', "%s", m);
  cr_expect_null(strstr(m, "mp_pool_"), "names a device-pool call: %s", m);
  cr_expect_null(strstr(m, "synchronize while"), "%s", m);
  cr_expect_not_null(strstr(m, "once the capture has ended"),
                     "says not what to do: %s", m);
}

Test(host_pool_capture_messages, trim) {
  said_by(mp_host_pool_trim(hp, 0), "mp_host_pool_trim");
}

Test(host_pool_capture_messages, destroy) {
  said_by(mp_host_pool_destroy(hp), "mp_host_pool_destroy");
}
