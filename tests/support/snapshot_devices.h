/* snapshot_devices.h - for tests of the device a snapshot names: each
 * segment's "device" and the shape of "device_traces" (how many lists,
 * how many events in each), read from the pickle snapshot.c writes
 * without a pickle reader: a walk over the opcodes it uses. */
#ifndef MEMPOOL_TESTS_SNAPSHOT_DEVICES_H
#define MEMPOOL_TESTS_SNAPSHOT_DEVICES_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

/* pool's snapshot, as mp_pool_snapshot_file writes it (*len bytes). */
static inline unsigned char *snapshot_bytes(mp_pool_t *pool, size_t *len) {
  char *buf = NULL;
  FILE *f = open_memstream(&buf, len);
  cr_assert_not_null(f);
  cr_assert_eq(mp_pool_snapshot_file(pool, f), MP_OK, "%s", mp_last_error());
  fclose(f);
  return (unsigned char *)buf;
}

/* The "device" of each segment, in devs[] (at most max; returns how
 * many): the key, then a BININT. */
static inline size_t snapshot_segment_devices(const unsigned char *buf,
                                              size_t len, int *devs,
                                              size_t max) {
  static const char key[] = "X\x06\0\0\0device";
  size_t n = 0;
  for (const unsigned char *at = buf;
       (at = memmem(at, len - (size_t)(at - buf), key, sizeof key - 1)) !=
       NULL;) {
    const unsigned char *v = at + sizeof key - 1;
    cr_assert_lt((size_t)(v - buf) + 5, len);
    cr_assert_eq(v[0], 'J', "a segment's device is no BININT");
    cr_assert_lt(n, max);
    devs[n++] = (int)((uint32_t)v[1] | (uint32_t)v[2] << 8 |
                      (uint32_t)v[3] << 16 | (uint32_t)v[4] << 24);
    at = v;
  }
  return n;
}

/* The number of events of each list of "device_traces", in counts[] (at
 * most max; returns how many lists). Walks the opcodes snapshot.c writes
 * (EMPTY_DICT/EMPTY_LIST, MARK, SETITEMS/APPENDS, BININT, LONG1,
 * BINUNICODE, NEWTRUE/NEWFALSE, TUPLE2), counting the dicts one level
 * inside each list. */
static inline size_t snapshot_trace_counts(const unsigned char *buf, size_t len,
                                           size_t *counts, size_t max) {
  static const char key[] = "X\x0d\0\0\0device_traces";
  const unsigned char *at = memmem(buf, len, key, sizeof key - 1);
  cr_assert_not_null(at, "no device_traces");
  size_t i = (size_t)(at - buf) + sizeof key - 1, n = 0;
  int depth = 0; /* MARKs open inside device_traces */
  bool opened = false;
  while (!opened || depth > 0) {
    cr_assert_lt(i, len, "the pickle ends inside device_traces");
    unsigned char op = buf[i];
    switch (op) {
    case '}':
    case ']':
      /* A list one level in is a device's; a dict two levels in, an event. */
      if (depth == 1 && op == ']') {
        cr_assert_lt(n, max);
        counts[n++] = 0;
      } else if (depth == 2 && op == '}') {
        counts[n - 1]++;
      }
      i++;
      break;
    case '(':
      depth++;
      opened = true;
      i++;
      break;
    case 'u':
    case 'e':
      depth--;
      i++;
      break;
    case 'J': i += 5; break;
    case 0x8a:
      cr_assert_lt(i + 1, len);
      i += 2 + buf[i + 1];
      break;
    case 'X':
      cr_assert_lt(i + 4, len);
      i += 5 + ((size_t)buf[i + 1] | (size_t)buf[i + 2] << 8 |
                (size_t)buf[i + 3] << 16 | (size_t)buf[i + 4] << 24);
      break;
    case 0x86:
    case 0x88:
    case 0x89: i++; break;
    default:
      cr_assert_fail("opcode 0x%02x at byte %zu: not one snapshot.c writes", op,
                     i);
    }
  }
  return n;
}

#endif
