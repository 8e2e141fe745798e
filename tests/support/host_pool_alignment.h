/* host_pool_alignment.h - the host pool's blocks aligned to the page
 * (align = the page size), on any device: every block starts on a page,
 * blocks of one chunk included, and an alignment past the page is refused
 * with a message that says why, creating nothing. Include after
 * Criterion. */
#ifndef MEMPOOL_TEST_HOST_POOL_ALIGNMENT_H
#define MEMPOOL_TEST_HOST_POOL_ALIGNMENT_H

#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <mempool/host_pool.h>
#include <mempool/mempool.h>

static inline void expect_host_pool_page_alignment(mp_device_t *dev) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  c.align = page;
  mp_host_pool_t *hp = NULL;
  cr_assert_eq(mp_host_pool_create(dev, &c, &hp), MP_OK, "align %zu: %s", page,
               mp_last_error());
  void *b[8];
  for (int i = 0; i < 8; i++) {
    cr_assert_eq(mp_host_pool_alloc(hp, 1000 + (size_t)i * 777, NULL, &b[i]),
                 MP_OK, "%s", mp_last_error());
    cr_expect_eq((uintptr_t)b[i] % page, 0, "block %d at %p is not on a page",
                 i, b[i]);
    memset(b[i], i, 1000);
  }
  for (int i = 0; i < 8; i++)
    cr_expect_eq(mp_host_pool_free(hp, b[i]), MP_OK);
  cr_expect_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK);
  /* Past the page: refused, nothing made. */
  c.align = 2 * page;
  hp = NULL;
  cr_expect_eq(mp_host_pool_create(dev, &c, &hp), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "align") != NULL, "%s", mp_last_error());
  cr_expect_null(hp);
}

#endif /* MEMPOOL_TEST_HOST_POOL_ALIGNMENT_H */
