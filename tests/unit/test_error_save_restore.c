/* test_error_save_restore.c - mp_error_save / mp_error_restore (status.h)
 * keep the thread's last error aside across cleanup that fails and put it
 * back whole: status, driver code and message; NULL is harmless, a
 * restored message is always terminated, and the state is per thread.
 * The state's layout can grow without breaking the ABI: mp_error_save
 * writes its version and zeroes the reserved room, a state of a version
 * the library does not know is ignored, changing nothing, and
 * mp_error_state_size() is the struct's size. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include <mempool/mempool.h>

#include "internal.h"

Test(error_save_restore, restore_brings_back_the_saved_failure) {
  mp__fail_driver(700, MP_EDRIVER, "the caller's own failure");
  mp_error_state_t saved;
  mp_error_save(&saved);
  cr_expect_eq(saved.status, MP_EDRIVER);
  cr_expect_eq(saved.driver_error, 700);
  cr_expect_str_eq(saved.message, "the caller's own failure");

  /* a cleanup that fails */
  mp_device_t *dev = NULL;
  cr_assert_neq(mp_device_open("host:capacity=nonsense", &dev), MP_OK);
  cr_assert_neq(mp_last_status(), MP_EDRIVER);
  cr_assert_str_neq(mp_last_error(), "the caller's own failure");

  mp_error_restore(&saved);
  cr_expect_eq(mp_last_status(), MP_EDRIVER);
  cr_expect_eq(mp_last_driver_error(), 700);
  cr_expect_str_eq(mp_last_error(), "the caller's own failure");
}

Test(error_save_restore, a_thread_that_saw_no_failure_restores_none) {
  mp_error_state_t saved;
  memset(&saved, 0x55, sizeof saved);
  mp_error_save(&saved);
  cr_expect_eq(saved.status, MP_OK);
  cr_expect_eq(saved.driver_error, 0);
  cr_expect_str_eq(saved.message, "");
  mp__fail(MP_EINVAL, "a cleanup's failure");
  mp_error_restore(&saved);
  cr_expect_eq(mp_last_status(), MP_OK);
  cr_expect_str_eq(mp_last_error(), "");
}

Test(error_save_restore, null_is_harmless) {
  mp__fail(MP_EBUSY, "kept");
  mp_error_save(NULL);
  mp_error_restore(NULL);
  cr_expect_eq(mp_last_status(), MP_EBUSY);
  cr_expect_str_eq(mp_last_error(), "kept");
}

Test(error_save_restore, an_unterminated_message_is_cut_and_terminated) {
  mp_error_state_t st = {.version = MP_ERROR_STATE_VERSION,
                         .status = MP_EINVAL,
                         .driver_error = 0};
  memset(st.message, 'x', sizeof st.message); /* no NUL anywhere */
  mp_error_restore(&st);
  const char *msg = mp_last_error();
  cr_expect_eq(strlen(msg), MP_ERROR_MESSAGE_MAX - 1);
  cr_expect_eq(msg[0], 'x');
  cr_expect_eq(mp_last_status(), MP_EINVAL);
}

Test(error_save_restore, the_message_holds_mp_last_error_whole) {
  char longest[MP_ERROR_MESSAGE_MAX + 64];
  memset(longest, 'y', sizeof longest - 1);
  longest[sizeof longest - 1] = '\0';
  mp__fail(MP_EINVAL, "%s", longest);
  size_t len = strlen(mp_last_error());
  mp_error_state_t saved;
  mp_error_save(&saved);
  mp__fail(MP_EIO, "short");
  mp_error_restore(&saved);
  cr_expect_eq(strlen(mp_last_error()), len);
  cr_expect_eq(len, MP_ERROR_MESSAGE_MAX - 1);
}

static void *restore_here(void *arg) {
  mp_error_restore(arg); /* this thread's error only */
  return (void *)(intptr_t)(mp_last_driver_error() == 719 &&
                            strcmp(mp_last_error(), "theirs") == 0);
}

static void *save_here(void *arg) {
  mp_error_save(arg); /* a thread that saw no failure */
  return NULL;
}

Test(error_save_restore, each_thread_has_its_own) {
  mp__fail_driver(700, MP_EDRIVER, "mine");
  mp_error_state_t theirs = {.version = MP_ERROR_STATE_VERSION,
                             .status = MP_EDRIVER,
                             .driver_error = 719};
  strcpy(theirs.message, "theirs");
  pthread_t t;
  void *ok = NULL;
  cr_assert_eq(pthread_create(&t, NULL, restore_here, &theirs), 0);
  cr_assert_eq(pthread_join(t, &ok), 0);
  cr_expect_eq((intptr_t)ok, 1);
  cr_expect_eq(mp_last_driver_error(), 700);
  cr_expect_str_eq(mp_last_error(), "mine");

  mp_error_state_t other;
  memset(&other, 0x55, sizeof other);
  cr_assert_eq(pthread_create(&t, NULL, save_here, &other), 0);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_expect_eq(other.status, MP_OK);
  cr_expect_eq(other.driver_error, 0);
  cr_expect_str_eq(other.message, "");
}

Test(error_save_restore, save_writes_the_version_and_zeroes_the_reserved_room) {
  mp__fail_driver(700, MP_EDRIVER, "saved");
  mp_error_state_t saved;
  memset(&saved, 0x55, sizeof saved);
  mp_error_save(&saved);
  cr_expect_eq(saved.version, MP_ERROR_STATE_VERSION);
  cr_expect_eq(saved.pad, 0);
  for (size_t i = 0; i < sizeof saved.reserved / sizeof saved.reserved[0]; i++)
    cr_expect_eq(saved.reserved[i], 0, "reserved[%zu]", i);
}

/* What a state of a version the library does not know does to the thread's
 * last error: nothing, not even a new failure recorded. */
static void expect_ignored(unsigned version) {
  mp__fail_driver(700, MP_EDRIVER, "the caller's own failure");
  uint64_t serial = mp__error_serial();
  mp_error_state_t st;
  memset(&st, 0, sizeof st);
  st.version = version;
  st.status = MP_EINVAL;
  st.driver_error = 719;
  strcpy(st.message, "a state of another layout");
  mp_error_restore(&st);
  cr_expect_eq(mp_last_status(), MP_EDRIVER, "version %u", version);
  cr_expect_eq(mp_last_driver_error(), 700, "version %u", version);
  cr_expect_str_eq(mp_last_error(), "the caller's own failure", "version %u",
                   version);
  cr_expect_eq(mp__error_serial(), serial, "version %u", version);
}

Test(error_save_restore, a_state_of_an_unknown_version_is_ignored) {
  expect_ignored(0); /* never filled by mp_error_save */
  expect_ignored(MP_ERROR_STATE_VERSION + 1); /* a later layout */
  expect_ignored(0x55555555u);
}

Test(error_save_restore, a_state_of_this_version_built_by_hand_is_restored) {
  mp__fail(MP_EBUSY, "before");
  mp_error_state_t st;
  memset(&st, 0, sizeof st);
  st.version = MP_ERROR_STATE_VERSION;
  st.status = MP_EINVAL;
  strcpy(st.message, "by hand");
  mp_error_restore(&st);
  cr_expect_eq(mp_last_status(), MP_EINVAL);
  cr_expect_str_eq(mp_last_error(), "by hand");
}

Test(error_save_restore, the_size_is_the_structs_and_fixed) {
  cr_expect_eq(mp_error_state_size(), sizeof(mp_error_state_t));
  /* status.h: the size and the message's place never change */
  cr_expect_eq(sizeof(mp_error_state_t), 592);
  cr_expect_eq(offsetof(mp_error_state_t, message), 80);
  cr_expect_eq(offsetof(mp_error_state_t, version), 0);
  cr_expect_eq(offsetof(mp_error_state_t, reserved), 16);
}
