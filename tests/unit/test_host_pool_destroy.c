/* test_host_pool_destroy.c - mp_host_pool_destroy when the device refuses
 * to free a page-locked chunk after it freed others: the pool underneath
 * is then destroyed (pool.h, mp_pool_destroy), so the host pool goes with
 * it and reports the refusal. Before, it kept its stream, its device view
 * and itself around a freed pool: leaked, and a second destroy freed the
 * pool twice. The host device never refuses a free, so the test wraps its
 * operations table: the n-th host_free fails. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <string.h>

#include "device/backend.h"
#include <mempool/mempool.h>

#define MiB ((size_t)1 << 20)

static mp__backend_t wrapped;
static const mp__backend_t *real;
static atomic_int host_frees, refuse_at = -1, streams_destroyed;

static mp_status_t refusing_host_free(mp_device_t *d, void *p) {
  if (atomic_fetch_add(&host_frees, 1) == refuse_at)
    return mp__fail(MP_EDRIVER, "test: the device refused this host free");
  return real->host_free(d, p);
}

static mp_status_t counted_stream_destroy(mp_device_t *d, mp_stream_t s) {
  atomic_fetch_add(&streams_destroyed, 1);
  return real->stream_destroy(d, s);
}

/* The host device, its host_free and stream_destroy wrapped. */
static mp_device_t *wrapped_host_device(void) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  real = dev->ops;
  wrapped = *real;
  wrapped.host_free = refusing_host_free;
  wrapped.stream_destroy = counted_stream_destroy;
  dev->ops = &wrapped;
  return dev;
}

Test(host_pool_destroy, a_free_refused_after_others_destroys_the_host_pool) {
  mp_device_t *dev = wrapped_host_device();
  mp_host_pool_t *hp;
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK, "%s",
               mp_last_error());
  void *a, *b;
  cr_assert_eq(mp_host_pool_alloc(hp, 4 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_host_pool_alloc(hp, 4 * MiB, NULL, &b), MP_OK);
  cr_assert_eq(mp_host_pool_free(hp, a), MP_OK);
  cr_assert_eq(mp_host_pool_free(hp, b), MP_OK);
  refuse_at = 1; /* the first chunk goes, the second is refused */
  cr_expect_eq(mp_host_pool_destroy(hp), MP_EDRIVER);
  cr_expect(strstr(mp_last_error(), "refused this host free") != NULL,
            "the refusal is reported: '%s'", mp_last_error());
  cr_expect_eq(atomic_load(&streams_destroyed), 1,
               "the host pool's own stream went with its pool (%d)",
               atomic_load(&streams_destroyed));
  dev->ops = real;
  mp_device_close(dev);
}

/* A refusal of the first free leaves the pool and the host pool as they
 * were: destroy again once the device frees. */
Test(host_pool_destroy, a_first_free_refused_keeps_the_host_pool) {
  mp_device_t *dev = wrapped_host_device();
  mp_host_pool_t *hp;
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK);
  void *a;
  cr_assert_eq(mp_host_pool_alloc(hp, 4 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_host_pool_free(hp, a), MP_OK);
  refuse_at = 0;
  cr_expect_eq(mp_host_pool_destroy(hp), MP_EDRIVER);
  cr_expect_eq(atomic_load(&streams_destroyed), 0);
  mp_stats_t st;
  cr_assert_eq(mp_host_pool_get_stats(hp, &st), MP_OK, "the host pool stays");
  cr_expect_eq(st.reserved_bytes, 4 * MiB);
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  cr_expect_eq(atomic_load(&streams_destroyed), 1);
  dev->ops = real;
  mp_device_close(dev);
}

/* Each refusal names the call the caller made, as the host pool's other
 * calls do (test_host_pool_bad_pointers.c): it said "mp_pool_destroy: ...",
 * a function the caller never called. The first free refused, and one
 * refused after another went. */
Test(host_pool_destroy, a_refusal_names_mp_host_pool_destroy) {
  mp_device_t *dev = wrapped_host_device();
  for (int at = 0; at < 2; at++) {
    mp_host_pool_t *hp;
    cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK);
    void *a, *b;
    cr_assert_eq(mp_host_pool_alloc(hp, 4 * MiB, NULL, &a), MP_OK);
    cr_assert_eq(mp_host_pool_alloc(hp, 4 * MiB, NULL, &b), MP_OK);
    cr_assert_eq(mp_host_pool_free(hp, a), MP_OK);
    cr_assert_eq(mp_host_pool_free(hp, b), MP_OK);
    atomic_store(&host_frees, 0);
    refuse_at = at;
    cr_expect_eq(mp_host_pool_destroy(hp), MP_EDRIVER);
    const char *m = mp_last_error();
    cr_expect(strncmp(m, "mp_host_pool_destroy: ", 22) == 0,
              "free %d refused: '%s'", at, m);
    cr_expect(strstr(m, "refused this host free") != NULL, "%s", m);
    refuse_at = -1;
    if (at == 0)
      cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  }
  dev->ops = real;
  mp_device_close(dev);
}
