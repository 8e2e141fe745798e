/* snapshot_fields.h - for tests of what a snapshot's dicts hold, read from
 * the pickle snapshot.c writes without a pickle reader: the values of a key
 * summed, the times a string is written. */
#ifndef MEMPOOL_TESTS_SNAPSHOT_FIELDS_H
#define MEMPOOL_TESTS_SNAPSHOT_FIELDS_H

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* s as snapshot.c writes a str (BINUNICODE, 4-byte length) into k (at
 * least strlen(s) + 5 bytes); its length. */
static inline size_t snapshot_str_op(const char *s, char *k) {
  size_t n = strlen(s);
  k[0] = 'X';
  k[1] = (char)n;
  k[2] = k[3] = k[4] = 0;
  memcpy(k + 5, s, n);
  return n + 5;
}

/* The sum of the values of key (a BININT each, as snapshot.c writes sizes
 * below 2 GiB) in a snapshot; *n: how many there are. */
static inline size_t snapshot_sum(const char *buf, size_t len, const char *key,
                                  size_t *n) {
  char k[64];
  size_t kl = snapshot_str_op(key, k);
  size_t sum = 0;
  *n = 0;
  for (const char *at = buf;
       (at = memmem(at, len - (size_t)(at - buf), k, kl)) != NULL;) {
    const unsigned char *v = (const unsigned char *)at + kl;
    cr_assert_eq(v[0], 'J', "%s is no BININT", key);
    sum += (size_t)v[1] | (size_t)v[2] << 8 | (size_t)v[3] << 16 |
           (size_t)v[4] << 24;
    (*n)++;
    at = (const char *)v;
  }
  return sum;
}

/* How many times the str s is written in a snapshot (a block state, an
 * event's action). */
static inline size_t snapshot_str_count(const char *buf, size_t len,
                                        const char *s) {
  char k[64];
  size_t kl = snapshot_str_op(s, k), n = 0;
  for (const char *at = buf;
       (at = memmem(at, len - (size_t)(at - buf), k, kl)) != NULL; at += kl)
    n++;
  return n;
}

/* The values of every key k (a BININT, or a LONG1 of at most 8 bytes, as
 * snapshot.c writes ints), in out[] (at most max); how many. */
static inline size_t snapshot_int_values(const unsigned char *buf, size_t len,
                                         const char *k, uint64_t *out,
                                         size_t max) {
  char key[64];
  size_t kl = snapshot_str_op(k, key), n = 0;
  for (const unsigned char *at = buf;
       (at = memmem(at, len - (size_t)(at - buf), key, kl)) != NULL;) {
    const unsigned char *v = at + kl;
    uint64_t x = 0;
    if (v[0] == 'J') {
      for (int i = 0; i < 4; i++)
        x |= (uint64_t)v[1 + i] << (8 * i);
    } else {
      cr_assert_eq(v[0], 0x8a, "%s is no int", k);
      for (int i = 0; i < v[1] && i < 8; i++)
        x |= (uint64_t)v[2 + i] << (8 * i);
    }
    cr_assert_lt(n, max);
    out[n++] = x;
    at = v;
  }
  return n;
}

#endif
