/* fuzz_pool - random operation sequences against the pool, for libFuzzer
 * (fuzz_pool) and as a plain seed replayer (fuzz_pool_replay, run by ctest).
 *
 * The input is a program: the first byte picks the configuration (virtual or
 * plain segments, alignment, max_split), then each 4-byte group is one
 * operation: alloc, free, contiguous alloc, record_stream, trim, child pool
 * create/alloc/free/destroy, bad frees. Live blocks are tagged at both ends
 * and checked before they are freed; mp_pool_check runs every 64 operations
 * and at the end. Any broken invariant, lost tag or unexpected status traps,
 * which is what libFuzzer (and ctest) reports. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_LIVE 64

#define FUZZ_REQUIRE(cond)                                                     \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_pool: %s failed at %s:%d (%s)\n", #cond, __FILE__, \
              __LINE__, mp_last_error());                                      \
      __builtin_trap();                                                        \
    }                                                                          \
  } while (0)

typedef struct fz_block {
  unsigned char *p;
  size_t bytes;
  unsigned char tag;
  int in_child;
} fz_block_t;

static mp_device_t *fz_dev[2];
static mp_stream_t fz_stream[2];

static void fz_open(void) {
  if (fz_dev[0] != NULL)
    return;
  FUZZ_REQUIRE(mp_device_open("host:capacity=256M", &fz_dev[0]) == MP_OK);
  FUZZ_REQUIRE(mp_device_open("host:capacity=256M,vmm=0", &fz_dev[1]) == MP_OK);
  for (int i = 0; i < 2; i++)
    FUZZ_REQUIRE(mp_stream_create(fz_dev[i], &fz_stream[i]) == MP_OK);
}

/* 1 B .. 8 MiB, log-scaled from two bytes. */
static size_t fz_size(uint8_t a, uint8_t b) {
  unsigned shift = a % 23;
  return 1 +
         (((size_t)b << 16 | (size_t)a << 8 | b) & (((size_t)1 << shift) - 1));
}

static void fz_tag(fz_block_t *b) {
  b->p[0] = b->tag;
  b->p[b->bytes - 1] = b->tag;
}

static void fz_verify(const fz_block_t *b) {
  FUZZ_REQUIRE(b->p[0] == b->tag && b->p[b->bytes - 1] == b->tag);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  fz_open();
  int plain = data[0] & 1;
  mp_device_t *dev = fz_dev[plain];
  mp_stream_t streams[2] = {NULL, fz_stream[plain]};
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  if (plain)
    cfg.flags &= ~(unsigned)MP_POOL_VIRTUAL;
  cfg.align = (size_t)256 << ((data[0] >> 1) & 3);
  cfg.max_split = (data[0] & 0x10) ? ((size_t)1 << 20) : 0;
  cfg.max_bytes = (data[0] & 0x20) ? ((size_t)64 << 20) : 0;
  mp_pool_t *pool, *child = NULL;
  FUZZ_REQUIRE(mp_pool_create(dev, &cfg, &pool) == MP_OK);
  fz_block_t live[FUZZ_LIVE];
  size_t n = 0;
  unsigned char tag = 1;
  for (size_t i = 1; i + 4 <= size; i += 4) {
    const uint8_t *op = data + i;
    mp_stream_t s = streams[op[1] & 1];
    switch (op[0] % 10) {
    case 0:
    case 1:
    case 2: { /* alloc, in the child when there is one and bit 7 says so */
      if (n == FUZZ_LIVE)
        break;
      int in_child = child != NULL && (op[0] & 0x80);
      fz_block_t b = {NULL, fz_size(op[2], op[3]), tag++, in_child};
      void *p;
      mp_status_t st = mp_pool_alloc(in_child ? child : pool, b.bytes, s, &p);
      FUZZ_REQUIRE(st == MP_OK || st == MP_ENOMEM || st == MP_ELIMIT);
      if (st != MP_OK)
        break;
      FUZZ_REQUIRE((uintptr_t)p % cfg.align == 0);
      b.p = p;
      fz_tag(&b);
      live[n++] = b;
      break;
    }
    case 3:
    case 4: { /* free */
      if (n == 0)
        break;
      size_t k = op[2] % n;
      fz_verify(&live[k]);
      FUZZ_REQUIRE(mp_pool_free(live[k].in_child ? child : pool, live[k].p) ==
                   MP_OK);
      live[k] = live[--n];
      break;
    }
    case 5: { /* contiguous */
      if (n + 3 > FUZZ_LIVE)
        break;
      size_t sizes[3] = {fz_size(op[2], op[3]), fz_size(op[3], op[2]),
                         fz_size(op[1], op[2])};
      void *out[3];
      mp_status_t st = mp_pool_alloc_contiguous(pool, 3, sizes, s, out);
      FUZZ_REQUIRE(st == MP_OK || st == MP_ENOMEM || st == MP_ELIMIT);
      if (st != MP_OK)
        break;
      for (int k = 0; k < 3; k++) {
        fz_block_t b = {out[k], sizes[k], tag++, 0};
        fz_tag(&b);
        live[n++] = b;
      }
      break;
    }
    case 6: /* record_stream */
      if (n > 0)
        FUZZ_REQUIRE(
            mp_pool_record_stream(live[op[2] % n].in_child ? child : pool,
                                  live[op[2] % n].p, s) == MP_OK);
      break;
    case 7: /* trim */
      FUZZ_REQUIRE(mp_pool_trim(pool, (size_t)op[2] << 16) == MP_OK);
      break;
    case 8: { /* child lifecycle */
      if (child == NULL) {
        mp_status_t st =
            mp_pool_create_child(pool, fz_size(op[2], op[3]), &child);
        FUZZ_REQUIRE(st == MP_OK || st == MP_ENOMEM || st == MP_ELIMIT);
        if (st != MP_OK)
          child = NULL;
      } else {
        FUZZ_REQUIRE(mp_pool_destroy(pool) == MP_EBUSY);
        for (size_t k = 0; k < n;) {
          if (live[k].in_child) {
            fz_verify(&live[k]);
            FUZZ_REQUIRE(mp_pool_free(child, live[k].p) == MP_OK);
            live[k] = live[--n];
          } else {
            k++;
          }
        }
        FUZZ_REQUIRE(mp_pool_check(child) == MP_OK);
        FUZZ_REQUIRE(mp_pool_destroy(child) == MP_OK);
        child = NULL;
      }
      break;
    }
    case 9: /* bad frees change nothing */
      if (n > 0) {
        fz_block_t *b = &live[op[2] % n];
        if (b->bytes > 1)
          FUZZ_REQUIRE(mp_pool_free(b->in_child ? child : pool, b->p + 1) ==
                       MP_EINVAL);
      }
      FUZZ_REQUIRE(mp_pool_free(pool, (void *)&tag) == MP_EINVAL);
      break;
    }
    if ((i / 4) % 64 == 0) {
      FUZZ_REQUIRE(mp_pool_check(pool) == MP_OK);
      if (child != NULL)
        FUZZ_REQUIRE(mp_pool_check(child) == MP_OK);
    }
  }
  for (size_t k = 0; k < n; k++) {
    fz_verify(&live[k]);
    FUZZ_REQUIRE(mp_pool_free(live[k].in_child ? child : pool, live[k].p) ==
                 MP_OK);
  }
  FUZZ_REQUIRE(mp_pool_check(pool) == MP_OK);
  if (child != NULL)
    FUZZ_REQUIRE(mp_pool_destroy(child) == MP_OK);
  mp_stats_t st;
  FUZZ_REQUIRE(mp_pool_get_stats(pool, &st) == MP_OK);
  FUZZ_REQUIRE(st.allocated_bytes == 0 && st.live_blocks == 0);
  FUZZ_REQUIRE(mp_pool_destroy(pool) == MP_OK);
  return 0;
}
