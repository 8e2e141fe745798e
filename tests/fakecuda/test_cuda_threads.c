/* The cuda backend used from several threads at once, on the fake driver:
 * each thread has its own context stack in the driver, and the backend's
 * bookkeeping is shared, so under TSan this checks that the context is made
 * current on whichever thread calls and that the address maps are locked. */
#include <pthread.h>
#include <string.h>

#include <mempool/mempool.h>

#include "fakecuda_test.h"

#define THREADS 4
#define ROUNDS  64

typedef struct worker {
  mp_device_t *dev;
  int id;
  int failures;
} worker_t;

static void *work(void *arg) {
  worker_t *w = arg;
  mp_stream_t s = NULL;
  mp_event_t e = NULL;
  unsigned char *h = NULL;
  if (mp_stream_create(w->dev, &s) != MP_OK ||
      mp_event_create(w->dev, &e) != MP_OK ||
      mp_device_host_alloc(w->dev, 64 << 10, (void **)&h) != MP_OK) {
    w->failures++;
    return NULL;
  }
  for (int r = 0; r < ROUNDS; r++) {
    size_t n = (size_t)(4 << 10) * (size_t)(1 + (r + w->id) % 16);
    unsigned char v = (unsigned char)(w->id * 31 + r);
    void *d = NULL;
    if (mp_device_alloc(w->dev, n, &d) != MP_OK) {
      w->failures++;
      continue;
    }
    bool ok = mp_memset_async(w->dev, d, v, n, s) == MP_OK &&
              mp_memcpy_async(w->dev, h, d, n, s) == MP_OK &&
              mp_event_record(w->dev, e, s) == MP_OK &&
              mp_event_synchronize(w->dev, e) == MP_OK && h[0] == v &&
              h[n - 1] == v;
    if (!ok || mp_device_free(w->dev, d) != MP_OK)
      w->failures++;
  }
  if (mp_device_host_free(w->dev, h) != MP_OK ||
      mp_event_destroy(w->dev, e) != MP_OK ||
      mp_stream_destroy(w->dev, s) != MP_OK)
    w->failures++;
  return NULL;
}

Test(cuda_threads, concurrent_allocs_copies_and_events) {
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("cuda", &dev), MP_OK, "%s", mp_last_error());
  pthread_t t[THREADS];
  worker_t w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker_t){.dev = dev, .id = i};
    cr_assert_eq(pthread_create(&t[i], NULL, work, &w[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    cr_assert_eq(w[i].failures, 0, "thread %d: %d failures", i, w[i].failures);
  }
  fk_assert_calls("cuMemAlloc_v2", THREADS * ROUNDS);
  fk_assert_calls("cuMemFree_v2", THREADS * ROUNDS);
  if (!fk_is_real())
    cr_assert_eq(fk_calls("cuCtxPushCurrent_v2"),
                 fk_calls("cuCtxPopCurrent_v2"));
  mp_device_close(dev);
  /* Nothing was left for close to release. */
  fk_assert_calls("cuMemFree_v2", THREADS * ROUNDS);
  fk_assert_calls("cuStreamDestroy_v2", THREADS);
}
