/* test_cuda_snapshot_device.c - a snapshot of a pool on cuda:N names
 * device N, as PyTorch's does: each segment's "device" is N, and
 * "device_traces" holds N + 1 lists, the pool's events in list N and the
 * lower ordinals' lists empty (memory_viz reads device_traces[device]).
 * Written both ways (mp_pool_snapshot to a path, mp_pool_snapshot_file),
 * for a pool with and without arenas, on the fake with three devices; the
 * GPU twin (gpu_cuda_snapshot_device) checks the ordinals the machine has
 * (one GPU: device 0 only). */
#include <stdlib.h>
#include <unistd.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/snapshot_devices.h"
#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)

static void three_devices(void) {
  setenv("FAKECUDA_DEVICE_COUNT", "3", 1);
}

/* The snapshot's bytes as mp_pool_snapshot writes them to a file. */
static unsigned char *snapshot_via_path(mp_pool_t *pool, size_t *len) {
  char path[] = "/tmp/mp_snapshot_device_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  cr_assert_eq(mp_pool_snapshot(pool, path), MP_OK, "%s", mp_last_error());
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  cr_assert_gt(n, 0);
  unsigned char *buf = malloc((size_t)n);
  cr_assert_not_null(buf);
  cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  unlink(path);
  *len = (size_t)n;
  return buf;
}

/* buf (a snapshot of a pool holding live memory, history on) names device
 * ord: every segment's device, and the events in device_traces[ord]. */
static void expect_device(const unsigned char *buf, size_t len, int ord,
                          const char *how) {
  int devs[64];
  size_t nseg = snapshot_segment_devices(buf, len, devs, 64);
  cr_expect_gt(nseg, 0, "%s: no segment", how);
  for (size_t i = 0; i < nseg; i++)
    cr_expect_eq(devs[i], ord, "%s: segment %zu is on device %d, not %d", how,
                 i, devs[i], ord);
  size_t counts[16];
  size_t nlists = snapshot_trace_counts(buf, len, counts, 16);
  cr_expect_eq(nlists, (size_t)ord + 1, "%s: %zu lists in device_traces", how,
               nlists);
  for (size_t d = 0; d < nlists && d < (size_t)ord; d++)
    cr_expect_eq(counts[d], 0, "%s: %zu events in device_traces[%zu]", how,
                 counts[d], d);
  if (nlists == (size_t)ord + 1)
    cr_expect_gt(counts[ord], 0, "%s: no events in device_traces[%d]", how,
                 ord);
}

static void check_ordinals(const char *opts) {
  int checked = 0;
  for (int ord = 0; ord < 3; ord++) {
    char spec[16];
    snprintf(spec, sizeof spec, "cuda:%d", ord);
    mp_device_t *d = NULL;
    if (mp_device_open(spec, &d) != MP_OK)
      break; /* a machine with fewer GPUs (the twin) */
    mp_pool_config_t cfg;
    mp_pool_config_init(&cfg);
    cr_assert_eq(mp_pool_config_parse(&cfg, opts), MP_OK);
    mp_pool_t *p = NULL;
    cr_assert_eq(mp_pool_create(d, &cfg, &p), MP_OK, "%s", mp_last_error());
    void *a;
    cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &a), MP_OK, "%s", mp_last_error());
    size_t len;
    unsigned char *buf = snapshot_via_path(p, &len);
    expect_device(buf, len, ord, "mp_pool_snapshot");
    free(buf);
    buf = snapshot_bytes(p, &len);
    expect_device(buf, len, ord, "mp_pool_snapshot_file");
    free(buf);
    cr_assert_eq(mp_pool_free(p, a), MP_OK);
    cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
    mp_device_close(d);
    checked++;
  }
  cr_assert_gt(checked, 0, "no CUDA device opened: %s", mp_last_error());
}

Test(cuda_snapshot_device, a_pools_snapshot_names_its_device,
     .init = three_devices) {
  check_ordinals("history=64");
}

Test(cuda_snapshot_device, a_pool_with_arenas_names_its_device,
     .init = three_devices) {
  check_ordinals("history=64,arenas=2");
}
