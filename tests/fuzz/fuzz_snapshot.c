/* fuzz_snapshot - libFuzzer harness for mpbench's PyTorch snapshot reader
 * (bench/core/pickle.c). Half the inputs are read as a pickle as they are
 * (byte 0 forced to PROTO so that they get past the first check); the
 * other half overwrite bytes of a small valid snapshot (SEED, written by
 * Python's pickle, protocol 4) and may cut it short, so mutations reach the
 * trace conversion. Each result must be a workload that ends empty, or a
 * refusal with a message that leaves the workload empty. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

#include "fuzz_require.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* pickle.dumps({"segments": [], "device_traces": [[alloc, alloc,
 * free_requested, free_completed, oom]]}, protocol=4) */
static const char SEED[] =
    "\x80\x04\x95\x28\x01\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x08\x73\x65"
    "\x67\x6d\x65\x6e\x74\x73\x94\x5d\x94\x8c\x0d\x64\x65\x76\x69\x63\x65\x5f"
    "\x74\x72\x61\x63\x65\x73\x94\x5d\x94\x5d\x94\x28\x7d\x94\x28\x8c\x06\x61"
    "\x63\x74\x69\x6f\x6e\x94\x8c\x05\x61\x6c\x6c\x6f\x63\x94\x8c\x04\x61\x64"
    "\x64\x72\x94\x8a\x06\x00\x00\x00\x00\x00\x7f\x8c\x04\x73\x69\x7a\x65\x94"
    "\x4d\x00\x10\x8c\x06\x73\x74\x72\x65\x61\x6d\x94\x4b\x00\x8c\x07\x74\x69"
    "\x6d\x65\x5f\x75\x73\x94\x4b\x05\x8c\x06\x66\x72\x61\x6d\x65\x73\x94\x5d"
    "\x94\x75\x7d\x94\x28\x68\x07\x68\x08\x68\x09\x8a\x06\x00\x10\x00\x00\x00"
    "\x7f\x68\x0a\x4a\x00\x00\x10\x00\x68\x0b\x4b\x03\x68\x0c\x4b\x05\x68\x0d"
    "\x5d\x94\x75\x7d\x94\x28\x68\x07\x8c\x0e\x66\x72\x65\x65\x5f\x72\x65\x71"
    "\x75\x65\x73\x74\x65\x64\x94\x68\x09\x8a\x06\x00\x00\x00\x00\x00\x7f\x68"
    "\x0a\x4d\x00\x10\x68\x0b\x4b\x00\x68\x0c\x4b\x05\x68\x0d\x5d\x94\x75\x7d"
    "\x94\x28\x68\x07\x8c\x0e\x66\x72\x65\x65\x5f\x63\x6f\x6d\x70\x6c\x65\x74"
    "\x65\x64\x94\x68\x09\x8a\x06\x00\x00\x00\x00\x00\x7f\x68\x0a\x4d\x00\x10"
    "\x68\x0b\x4b\x00\x68\x0c\x4b\x05\x68\x0d\x5d\x94\x75\x7d\x94\x28\x68\x07"
    "\x8c\x03\x6f\x6f\x6d\x94\x68\x09\x4b\x00\x68\x0a\x8a\x06\x00\x00\x00\x00"
    "\x00\x01\x68\x0b\x4b\x00\x68\x0c\x4b\x05\x68\x0d\x5d\x94\x75\x65\x61\x75"
    "\x2e";

static void fz_check(const uint8_t *buf, size_t len) {
  mpb_workload_t w;
  mp_status_t st = mpb_snapshot_parse(buf, len, "fuzz", "fuzz", &w);
  if (st == MP_OK) {
    size_t live = 0;
    for (size_t i = 0; i < w.n; i++)
      live += w.ev[i].op == MPB_ALLOC ? w.ev[i].size : -w.ev[i].size;
    FZ_REQUIRE(live == 0);
    mpb_workload_free(&w);
  } else {
    FZ_REQUIRE(st == MP_EINVAL || st == MP_ENOMEM);
    FZ_REQUIRE(mp_last_error()[0] != '\0');
    FZ_REQUIRE(w.n == 0 && w.ev == NULL);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  uint8_t *buf;
  size_t len;
  if (data[0] & 1) {
    len = size - 1;
    buf = malloc(len);
    if (buf == NULL)
      return 0;
    memcpy(buf, data + 1, len);
    buf[0] = 0x80;
  } else {
    len = sizeof SEED - 1;
    buf = malloc(len);
    if (buf == NULL)
      return 0;
    memcpy(buf, SEED, len);
    /* (offset, byte) pairs; a last odd byte cuts the pickle there. */
    size_t i = 1;
    for (; i + 1 < size; i += 2)
      buf[data[i] % len] = data[i + 1];
    if (i < size)
      len = data[i] % len;
  }
  fz_check(buf, len);
  free(buf);
  return 0;
}
