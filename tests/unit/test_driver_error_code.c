/* test_driver_error_code.c - mp_last_driver_error() follows the thread's
 * last failure: the driver's code of an MP_EDRIVER (mp__fail_driver),
 * kept by a message that wraps it (mp__fail of MP_EDRIVER right after),
 * 0 after a failure of another status or a driver error the library maps
 * to a status of its own, kept aside and put back with the message
 * (mp__error_save / mp__error_restore), and per thread. */
#include <criterion/criterion.h>
#include <pthread.h>

#include "internal.h"

Test(driver_error_code, a_drivers_failure_keeps_its_code) {
  cr_assert_eq(mp__fail_driver(700, MP_EDRIVER, "cuX: 700"), MP_EDRIVER);
  cr_expect_eq(mp_last_driver_error(), 700);
  cr_expect_eq(mp_last_status(), MP_EDRIVER);
}

Test(driver_error_code, a_message_that_wraps_it_keeps_the_code) {
  mp__fail_driver(719, MP_EDRIVER, "cuX: 719");
  mp__fail(MP_EDRIVER, "outer: %s", mp_last_error());
  cr_expect_eq(mp_last_driver_error(), 719);
  cr_expect_str_eq(mp_last_error(), "outer: cuX: 719");
}

Test(driver_error_code, another_failure_clears_it) {
  mp__fail_driver(700, MP_EDRIVER, "cuX");
  mp__fail(MP_EINVAL, "bad argument");
  cr_expect_eq(mp_last_driver_error(), 0);
  /* and an MP_EDRIVER after it does not bring the old code back */
  mp__fail(MP_EDRIVER, "no driver call behind this one");
  cr_expect_eq(mp_last_driver_error(), 0);
}

Test(driver_error_code, a_stored_failure_raised_again_names_its_own_code) {
  mp__fail_driver(700, MP_EDRIVER, "an unrelated earlier failure");
  mp__fail_driver(0, MP_EDRIVER, "a stored failure without a driver code");
  cr_expect_eq(mp_last_driver_error(), 0);
}

Test(driver_error_code, a_driver_error_with_a_status_of_its_own_has_no_code) {
  mp__fail_driver(2, MP_ENOMEM, "cuX: CUDA_ERROR_OUT_OF_MEMORY");
  cr_expect_eq(mp_last_driver_error(), 0);
}

Test(driver_error_code, save_and_restore_carry_the_code) {
  mp__fail_driver(700, MP_EDRIVER, "kept");
  mp__error_saved_t saved;
  mp__error_save(&saved);
  mp__fail_driver(719, MP_EDRIVER, "recovered from");
  mp__error_restore(&saved);
  cr_expect_eq(mp_last_driver_error(), 700);
  cr_expect_str_eq(mp_last_error(), "kept");
}

static void *other_thread(void *arg) {
  (void)arg;
  return (void *)(intptr_t)mp_last_driver_error();
}

Test(driver_error_code, each_thread_has_its_own) {
  mp__fail_driver(700, MP_EDRIVER, "this thread's");
  pthread_t t;
  void *seen = (void *)1;
  cr_assert_eq(pthread_create(&t, NULL, other_thread, NULL), 0);
  cr_assert_eq(pthread_join(t, &seen), 0);
  cr_expect_eq((intptr_t)seen, 0);
  cr_expect_eq(mp_last_driver_error(), 700);
}
