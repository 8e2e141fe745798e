/* mp_torch_record_stream_ex of a pointer no default pool holds says why,
 * as mp_torch_free does (mp__default_owner: none made yet, none could be,
 * or none of the devices' pools has it): its message was replaced by "%p
 * is no pool's", which dropped the reason. Still MP_EINVAL. (With one
 * device, as here once a pool is made, that pool itself says what is
 * wrong with the pointer: mp_pool_record_stream's message, as before.) */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/default_pool_host.h"

TestSuite(torch_record_stream_says_why, .init = on_host);

Test(torch_record_stream_says_why, before_any_pool_was_made) {
  int x;
  cr_assert_eq(mp_torch_record_stream_ex(&x, NULL), MP_EINVAL);
  cr_expect_not_null(strstr(mp_last_error(), "none was made yet"), "%s",
                     mp_last_error());
  cr_expect_not_null(strstr(mp_last_error(), "mp_torch_record_stream"), "%s",
                     mp_last_error());
}
