/* Pause and resume on the synchronous fake device, with device failures the
 * host backend cannot produce: an unmap that fails halfway through a pause
 * must leave the pool running with every live byte where it was. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* The fake device, with vm_unmap call #unmap_fail_at (1-based) failing. */
static unsigned unmap_calls, unmap_fail_at;

static mp_status_t flaky_vm_unmap(mp_device_t *dev, void *addr, size_t bytes) {
  if (++unmap_calls == unmap_fail_at)
    return mp__fail(MP_EDRIVER, "fake vm_unmap #%u fails", unmap_calls);
  return fake_vm_unmap(dev, addr, bytes);
}

/* Page-locked memory for the pause's copy: the fake has none of its own. */
static mp_status_t flaky_host_alloc(mp_device_t *dev, size_t bytes,
                                    void **out) {
  (void)dev;
  *out = malloc(bytes);
  return *out != NULL ? MP_OK : MP_ENOMEM;
}

static mp_status_t flaky_host_free(mp_device_t *dev, void *ptr) {
  (void)dev;
  free(ptr);
  return MP_OK;
}

static mp__backend_t flaky_backend;

static mp_device_t *flaky_open(unsigned fail_at) {
  flaky_backend = fake_backend;
  flaky_backend.vm_unmap = flaky_vm_unmap;
  flaky_backend.host_alloc = flaky_host_alloc;
  flaky_backend.host_free = flaky_host_free;
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  dev->ops = &flaky_backend;
  unmap_calls = 0;
  unmap_fail_at = fail_at;
  return dev;
}

/* Block i holds the byte 0x40 + i throughout. */
static void fill(void *p, size_t n, unsigned i) {
  memset(p, 0x40 + (int)i, n);
}

static size_t first_difference(const void *p, size_t n, unsigned i) {
  const unsigned char *c = p;
  size_t at = 0;
  while (at < n && c[at] == 0x40 + i)
    at++;
  return at;
}

Test(pool_pause, a_keep_content_pause_whose_unmap_fails_halfway_keeps_data) {
  mp_device_t *dev = flaky_open(3);
  mp_pool_t *p = make_pool(dev, NULL);
  void *v[4];
  for (unsigned i = 0; i < 4; i++) {
    cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[i]), MP_OK);
    fill(v[i], 2 * MiB, i);
  }
  cr_assert_eq(p->vseg->nchunks, 4, "the test needs four chunks");
  mp_stats_t before = stats(p);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_EDRIVER);
  cr_expect(strstr(mp_last_error(), "vm_unmap #3") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(unmap_calls, 3);
  mp_stats_t after = stats(p);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(fake_of(dev)->used, before.reserved_bytes);
  for (unsigned i = 0; i < 4; i++) {
    size_t at = first_difference(v[i], 2 * MiB, i);
    cr_expect_eq(at, 2 * MiB, "block %u lost its content from byte %zu", i, at);
  }
  check(p); /* running, not paused */
  for (unsigned i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  mp_pool_destroy(p);
  cr_expect_eq(fake_of(dev)->used, 0);
  cr_expect_eq(fake_of(dev)->bad_unmaps, 0);
  fake_close(dev);
}
