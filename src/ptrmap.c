/* ptrmap.c - the address-keyed hash map behind every pointer table of the
 * library: the host device's allocations, mappings, streams and events, the
 * cuda backend's driver objects, the direct allocator's blocks and the
 * LD_PRELOAD shim's table of pointers it handed out.
 *
 * Why one map: each of those answers "is this pointer one of mine?" on
 * every free, so the lookup must be O(1) whatever the number of live
 * pointers, and a foreign or stale pointer must be told apart without ever
 * being dereferenced. Four copies of the same probing and deletion code had
 * grown; this is the one they share.
 *
 * Algorithm: open addressing with linear probing over a power-of-two table
 * of caller-defined entries whose first member is the uintptr_t key; key 0
 * marks an empty slot (no object lives at address 0). Keys are spread with
 * the 64-bit murmur3 finalizer, since addresses share their low (alignment)
 * and high bits. Deletion shifts later members of the probe run back into
 * the hole, so there are no tombstones and a lookup stops at the first
 * empty slot. The table doubles at half load, which keeps probes short.
 *
 * Invariant: every key present is reachable from its home slot through
 * occupied slots only; count is the number of occupied slots. The map does
 * no locking: each owner guards it with its own lock. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static size_t mp__ptrmap_home(uintptr_t key, size_t cap) {
  uint64_t h = (uint64_t)key;
  h ^= h >> 33;
  h *= UINT64_C(0xff51afd7ed558ccd);
  h ^= h >> 33;
  return (size_t)h & (cap - 1);
}

static unsigned char *mp__ptrmap_slot(const mp__ptrmap_t *m, size_t i) {
  return m->slots + i * m->esize;
}

static uintptr_t mp__ptrmap_key_at(const mp__ptrmap_t *m, size_t i) {
  uintptr_t key;
  memcpy(&key, mp__ptrmap_slot(m, i), sizeof key);
  return key;
}

void mp__ptrmap_init(mp__ptrmap_t *m, size_t entry_size) {
  *m = (mp__ptrmap_t){.esize = entry_size};
}

void mp__ptrmap_destroy(mp__ptrmap_t *m) {
  free(m->slots);
  mp__ptrmap_init(m, m->esize);
}

/* Index of key, or cap when absent. */
static size_t mp__ptrmap_index(const mp__ptrmap_t *m, uintptr_t key) {
  if (m->cap == 0 || key == 0)
    return m->cap;
  for (size_t i = mp__ptrmap_home(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
    uintptr_t k = mp__ptrmap_key_at(m, i);
    if (k == key)
      return i;
    if (k == 0)
      return m->cap;
  }
}

void *mp__ptrmap_find(const mp__ptrmap_t *m, uintptr_t key) {
  size_t i = mp__ptrmap_index(m, key);
  return i == m->cap ? NULL : mp__ptrmap_slot(m, i);
}

/* Copies the entry of a key known to be absent into its probe position. */
static unsigned char *mp__ptrmap_place(mp__ptrmap_t *m, uintptr_t key) {
  size_t i = mp__ptrmap_home(key, m->cap);
  while (mp__ptrmap_key_at(m, i) != 0)
    i = (i + 1) & (m->cap - 1);
  return mp__ptrmap_slot(m, i);
}

bool mp__ptrmap_reserve(mp__ptrmap_t *m, size_t more) {
  if (more > SIZE_MAX / 4 - m->count)
    return false;
  size_t need = m->count + more;
  if (need * 2 <= m->cap)
    return true;
  size_t cap = m->cap ? m->cap : 64;
  while (need * 2 > cap) {
    if (cap > SIZE_MAX / 2 / m->esize)
      return false;
    cap *= 2;
  }
  unsigned char *slots = mp__host_calloc(cap, m->esize);
  if (slots == NULL)
    return false;
  mp__ptrmap_t old = *m;
  m->slots = slots;
  m->cap = cap;
  for (size_t i = 0; i < old.cap; i++) {
    uintptr_t key = mp__ptrmap_key_at(&old, i);
    if (key != 0)
      memcpy(mp__ptrmap_place(m, key), mp__ptrmap_slot(&old, i), m->esize);
  }
  free(old.slots);
  return true;
}

void *mp__ptrmap_put(mp__ptrmap_t *m, uintptr_t key) {
  if (key == 0)
    return NULL;
  unsigned char *e = mp__ptrmap_find(m, key);
  if (e != NULL)
    return e;
  if (!mp__ptrmap_reserve(m, 1))
    return NULL;
  e = mp__ptrmap_place(m, key);
  memset(e, 0, m->esize);
  memcpy(e, &key, sizeof key);
  m->count++;
  return e;
}

void mp__ptrmap_remove(mp__ptrmap_t *m, void *entry) {
  size_t mask = m->cap - 1;
  size_t hole = (size_t)((unsigned char *)entry - m->slots) / m->esize;
  for (size_t j = (hole + 1) & mask;; j = (j + 1) & mask) {
    uintptr_t key = mp__ptrmap_key_at(m, j);
    if (key == 0)
      break;
    /* The entry at j may fill the hole unless its home lies cyclically in
     * (hole, j]: then a probe from its home would never pass the hole. */
    size_t home = mp__ptrmap_home(key, m->cap);
    bool stays =
        (hole <= j) ? (hole < home && home <= j) : (hole < home || home <= j);
    if (!stays) {
      memcpy(mp__ptrmap_slot(m, hole), mp__ptrmap_slot(m, j), m->esize);
      hole = j;
    }
  }
  memset(mp__ptrmap_slot(m, hole), 0, m->esize);
  m->count--;
}

bool mp__ptrmap_take(mp__ptrmap_t *m, uintptr_t key, void *out) {
  void *e = mp__ptrmap_find(m, key);
  if (e == NULL)
    return false;
  if (out != NULL)
    memcpy(out, e, m->esize);
  mp__ptrmap_remove(m, e);
  return true;
}

void *mp__ptrmap_at(const mp__ptrmap_t *m, size_t i) {
  return mp__ptrmap_key_at(m, i) != 0 ? mp__ptrmap_slot(m, i) : NULL;
}
