/* test_api_prototypes.c - every function of API.md, declared again exactly
 * as API.md writes it after the headers (as a program or a check outside
 * this repository may do): a header that named one of them by a
 * function-like macro, or gave it another type, breaks this file's build.
 * Then each name reaches the library's function of that name. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

/* API.md's declarations, in its order, comments left out. */
const char *mp_status_string(mp_status_t s);
mp_status_t mp_device_open(const char *spec, mp_device_t **out);
void mp_device_close(mp_device_t *dev);
const char *mp_device_name(const mp_device_t *dev);
mp_status_t mp_device_mem_info(mp_device_t *dev, size_t *free_bytes,
                               size_t *total_bytes);
mp_status_t mp_device_alloc(mp_device_t *dev, size_t bytes, void **out);
mp_status_t mp_device_free(mp_device_t *dev, void *ptr);
mp_status_t mp_device_host_alloc(mp_device_t *dev, size_t bytes, void **out);
mp_status_t mp_device_host_free(mp_device_t *dev, void *ptr);
mp_status_t mp_stream_create(mp_device_t *dev, mp_stream_t *out);
mp_status_t mp_stream_destroy(mp_device_t *dev, mp_stream_t s);
mp_status_t mp_stream_synchronize(mp_device_t *dev, mp_stream_t s);
mp_status_t mp_stream_launch_host(mp_device_t *dev, mp_stream_t s,
                                  void (*fn)(void *), void *arg);
mp_status_t mp_memcpy_async(mp_device_t *dev, void *dst, const void *src,
                            size_t n, mp_stream_t s);
mp_status_t mp_memset_async(mp_device_t *dev, void *dst, int value, size_t n,
                            mp_stream_t s);
mp_status_t mp_event_create(mp_device_t *dev, mp_event_t *out);
mp_status_t mp_event_destroy(mp_device_t *dev, mp_event_t e);
mp_status_t mp_event_record(mp_device_t *dev, mp_event_t e, mp_stream_t s);
mp_status_t mp_event_query(mp_device_t *dev, mp_event_t e);
mp_status_t mp_event_synchronize(mp_device_t *dev, mp_event_t e);
mp_status_t mp_stream_wait_event(mp_device_t *dev, mp_stream_t s, mp_event_t e);
void mp_pool_config_init(mp_pool_config_t *cfg);
mp_status_t mp_pool_create(mp_device_t *dev, const mp_pool_config_t *cfg,
                           mp_pool_t **out);
mp_status_t mp_pool_destroy(mp_pool_t *pool);
mp_status_t mp_pool_alloc(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                          void **out);
mp_status_t mp_pool_free(mp_pool_t *pool, void *ptr);
mp_status_t mp_pool_record_stream(mp_pool_t *pool, void *ptr, mp_stream_t s);
mp_status_t mp_pool_alloc_contiguous(mp_pool_t *pool, size_t count,
                                     const size_t *sizes, mp_stream_t s,
                                     void **out /* count pointers */);
mp_status_t mp_pool_trim(mp_pool_t *pool, size_t keep_bytes);
mp_status_t mp_pool_create_child(mp_pool_t *parent, size_t bytes,
                                 mp_pool_t **out);
mp_status_t mp_pool_freeze(mp_pool_t *pool);
mp_status_t mp_pool_alloc_movable(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                                  mp_handle_t **out);
void *mp_handle_ptr(const mp_handle_t *h);
mp_status_t mp_handle_free(mp_handle_t *h);
mp_status_t mp_pool_defragment(mp_pool_t *pool, mp_stream_t s,
                               size_t *moved_bytes /* may be NULL */);
mp_status_t mp_pool_check(mp_pool_t *pool);
mp_status_t mp_pool_pause(mp_pool_t *pool, unsigned flags);
mp_status_t mp_pool_resume(mp_pool_t *pool);
mp_status_t mp_pool_get_stats(mp_pool_t *pool, mp_stats_t *out);
mp_status_t mp_pool_reset_peaks(mp_pool_t *pool);
mp_status_t mp_pool_dump(mp_pool_t *pool, FILE *out, const char *format);
mp_status_t mp_direct_create(mp_device_t *dev, mp_direct_t **out);
mp_status_t mp_direct_alloc(mp_direct_t *d, size_t bytes, mp_stream_t s,
                            void **out);
mp_status_t mp_direct_free(mp_direct_t *d, void *ptr);
mp_status_t mp_direct_free_session(mp_direct_t *d);
mp_status_t mp_direct_get_stats(mp_direct_t *d, mp_stats_t *out);
mp_status_t mp_direct_destroy(mp_direct_t *d);
mp_status_t mp_malloc(void **ptr, size_t bytes);
mp_status_t mp_malloc_async(void **ptr, size_t bytes, mp_stream_t s);
mp_status_t mp_free(void *ptr);
mp_status_t mp_free_async(void *ptr, mp_stream_t s);
mp_pool_t *mp_default_pool(void);

Test(api_prototypes, each_name_reaches_its_function) {
  void (*const fns[])(void) = {(void (*)(void))mp_status_string,
                               (void (*)(void))mp_device_open,
                               (void (*)(void))mp_device_close,
                               (void (*)(void))mp_device_name,
                               (void (*)(void))mp_device_mem_info,
                               (void (*)(void))mp_device_alloc,
                               (void (*)(void))mp_device_free,
                               (void (*)(void))mp_device_host_alloc,
                               (void (*)(void))mp_device_host_free,
                               (void (*)(void))mp_stream_create,
                               (void (*)(void))mp_stream_destroy,
                               (void (*)(void))mp_stream_synchronize,
                               (void (*)(void))mp_stream_launch_host,
                               (void (*)(void))mp_memcpy_async,
                               (void (*)(void))mp_memset_async,
                               (void (*)(void))mp_event_create,
                               (void (*)(void))mp_event_destroy,
                               (void (*)(void))mp_event_record,
                               (void (*)(void))mp_event_query,
                               (void (*)(void))mp_event_synchronize,
                               (void (*)(void))mp_stream_wait_event,
                               (void (*)(void))mp_pool_config_init,
                               (void (*)(void))mp_pool_create,
                               (void (*)(void))mp_pool_destroy,
                               (void (*)(void))mp_pool_alloc,
                               (void (*)(void))mp_pool_free,
                               (void (*)(void))mp_pool_record_stream,
                               (void (*)(void))mp_pool_alloc_contiguous,
                               (void (*)(void))mp_pool_trim,
                               (void (*)(void))mp_pool_create_child,
                               (void (*)(void))mp_pool_freeze,
                               (void (*)(void))mp_pool_alloc_movable,
                               (void (*)(void))mp_handle_ptr,
                               (void (*)(void))mp_handle_free,
                               (void (*)(void))mp_pool_defragment,
                               (void (*)(void))mp_pool_check,
                               (void (*)(void))mp_pool_pause,
                               (void (*)(void))mp_pool_resume,
                               (void (*)(void))mp_pool_get_stats,
                               (void (*)(void))mp_pool_reset_peaks,
                               (void (*)(void))mp_pool_dump,
                               (void (*)(void))mp_direct_create,
                               (void (*)(void))mp_direct_alloc,
                               (void (*)(void))mp_direct_free,
                               (void (*)(void))mp_direct_free_session,
                               (void (*)(void))mp_direct_get_stats,
                               (void (*)(void))mp_direct_destroy,
                               (void (*)(void))mp_malloc,
                               (void (*)(void))mp_malloc_async,
                               (void (*)(void))mp_free,
                               (void (*)(void))mp_free_async,
                               (void (*)(void))mp_default_pool};
  size_t n = sizeof fns / sizeof *fns;
  cr_expect_eq(n, 52);
  for (size_t i = 0; i < n; i++) {
    cr_expect_not_null(fns[i], "%zu", i);
    for (size_t j = 0; j < i; j++)
      cr_expect_neq(fns[i], fns[j], "%zu and %zu are one function", i, j);
  }
  /* Through the names, as a program built with these headers calls them:
   * the config of this header's size, the stats of this header's size. */
  unsetenv("MEMPOOL_CONF");
  mp_pool_config_t c;
  memset(&c, 0xAB, sizeof c);
  mp_pool_config_init(&c);
  cr_expect_eq(c.struct_size, sizeof(mp_pool_config_t));
  cr_expect_eq(c.align, 512);
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, &c, &pool), MP_OK, "%s", mp_last_error());
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p), MP_OK);
  mp_status_t (*get)(mp_pool_t *, mp_stats_t *) = mp_pool_get_stats;
  mp_stats_t st;
  memset(&st, 0, sizeof st);
  cr_assert_eq(get(pool, &st), MP_OK);
  cr_expect_eq(st.struct_size, sizeof(mp_stats_t));
  cr_expect_eq(st.live_blocks, 1);
  cr_expect_eq(mp_pool_free(pool, p), MP_OK);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}
