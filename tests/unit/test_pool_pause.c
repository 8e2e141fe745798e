/* Pause and resume on the synchronous fake device, with device failures the
 * host backend cannot produce: an unmap that fails halfway through a pause
 * must leave the pool running with every live byte where it was; and a
 * pause that runs while the out-of-memory ladder holds a block keeps the
 * pool's figures, and a freeze then fences only the blocks live. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "../support/dump_json.h"
#include "../support/pool_helpers.h"
#include "../support/snapshot_fields.h"
#include "flaky_unmap.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

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

/* Four 2 MiB blocks, one chunk each, block i filled with its byte, in a
 * pool made with opts. */
static mp_pool_t *four_chunks_with(mp_device_t *dev, void *v[4],
                                   const char *opts) {
  mp_pool_t *p = make_pool(dev, opts);
  for (unsigned i = 0; i < 4; i++) {
    cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[i]), MP_OK);
    fill(v[i], 2 * MiB, i);
  }
  cr_assert_eq(p->vseg->nchunks, 4, "the test needs four chunks");
  return p;
}

static mp_pool_t *four_chunks(mp_device_t *dev, void *v[4]) {
  return four_chunks_with(dev, v, NULL);
}

/* A keep-content pause with no page-locked memory for the content leaves
 * the pool running, every block where it was, and says so: what failed
 * (the host copy, its size) and that the pool is not paused. Failed
 * before: the message was the device's alone. */
Test(pool_pause, a_keep_content_pause_without_host_memory_says_why) {
  mp_device_t *dev = flaky_open(0);
  void *v[4];
  mp_pool_t *p = four_chunks(dev, v);
  mp_stats_t before = stats(p);
  host_alloc_fails = true;
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_ENOMEM);
  const char *e = mp_last_error();
  cr_expect(strstr(e, "mp_pool_pause") != NULL, "%s", e);
  cr_expect(strstr(e, "fake host_alloc of 8388608 bytes fails") != NULL, "%s",
            e);
  cr_expect(strstr(e, "page-locked") != NULL, "%s", e);
  cr_expect(strstr(e, "not paused") != NULL, "%s", e);
  cr_expect(!mp__pool_is_paused(p));
  cr_expect_eq(stats(p).reserved_bytes, before.reserved_bytes);
  cr_expect_eq(fake_of(dev)->used, before.reserved_bytes);
  for (unsigned i = 0; i < 4; i++) {
    size_t at = first_difference(v[i], 2 * MiB, i);
    cr_expect_eq(at, 2 * MiB, "block %u lost its content from byte %zu", i, at);
  }
  check(p);
  host_alloc_fails = false;
  cr_expect_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  for (unsigned i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  mp_pool_destroy(p);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}

/* After a failed undo: a resume brings every block back with its content,
 * the device holding exactly the pool's chunks; destroy then gives back
 * exactly what is mapped. */
static void resume_and_finish(mp_device_t *dev, mp_pool_t *p, void *v[4],
                              size_t reserved) {
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  cr_expect(!mp__pool_is_paused(p));
  cr_expect_eq(stats(p).reserved_bytes, reserved);
  cr_expect_eq(fake_of(dev)->used, reserved,
               "the device holds %zu bytes for %zu reserved",
               fake_of(dev)->used, reserved);
  for (unsigned i = 0; i < 4; i++) {
    size_t at = first_difference(v[i], 2 * MiB, i);
    cr_expect_eq(at, 2 * MiB, "block %u lost its content from byte %zu", i, at);
  }
  check(p);
  for (unsigned i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  cr_expect_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 0);
  cr_expect_eq(fake_of(dev)->bad_unmaps, 0);
  fake_close(dev);
}

/* A pause whose unmap fails, and whose undo cannot map back what it had
 * unmapped (no room any more): some chunks stay unmapped, so the pool
 * stays paused (its content kept, the message says so) and a resume maps
 * back exactly those. Failed before: the pool ran on with a chunk
 * unmapped under its live blocks, and a resume was MP_EINVAL. */
/* The same failure, and then the undo's copy of the content back fails
 * too (the fake's memcpy #n refused): the pool stays paused with its host
 * copy and every chunk mapped, says so, and a resume brings the content
 * back. It ran on with the content of the chunks unmapped lost, and the
 * message named only the copy's failure. */
static unsigned copies, copy_fails_at;

static mp_status_t copy_failing_once(mp_device_t *dev, void *dst,
                                     const void *src, size_t n, mp_stream_t s) {
  if (++copies == copy_fails_at)
    return mp__fail(MP_EDRIVER, "fake memcpy #%u fails", copies);
  return fake_memcpy(dev, dst, src, n, s);
}

Test(pool_pause, a_failed_undo_copy_keeps_the_content_for_resume) {
  mp_device_t *dev = flaky_open(2);
  flaky_backend.memcpy_async = copy_failing_once;
  copies = 0;
  copy_fails_at = 5; /* four copies out, then the first copy back */
  void *v[4];
  mp_pool_t *p = four_chunks(dev, v);
  size_t reserved = stats(p).reserved_bytes;
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_EDRIVER);
  cr_expect(strstr(mp_last_error(), "vm_unmap #2") != NULL &&
                strstr(mp_last_error(), "memcpy #5") != NULL &&
                strstr(mp_last_error(), "stays paused") != NULL,
            "%s", mp_last_error());
  cr_expect(mp__pool_is_paused(p), "the pool ran on without its content");
  resume_and_finish(dev, p, v, reserved);
}

Test(pool_pause, a_pause_whose_undo_fails_stays_paused_and_resumes) {
  mp_device_t *dev = flaky_open(2);
  void *v[4];
  mp_pool_t *p = four_chunks(dev, v);
  size_t reserved = stats(p).reserved_bytes, capacity = fake_of(dev)->capacity;
  /* The chunk unmapped first cannot be mapped again. */
  fake_of(dev)->capacity = reserved - MiB;
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_EDRIVER);
  cr_expect(strstr(mp_last_error(), "vm_unmap #2") != NULL, "%s",
            mp_last_error());
  cr_expect(strstr(mp_last_error(), "stays paused") != NULL, "%s",
            mp_last_error());
  cr_expect(mp__pool_is_paused(p), "running with a chunk unmapped");
  cr_expect_eq(fake_of(dev)->used, reserved - 2 * MiB);
  fake_of(dev)->capacity = capacity;
  resume_and_finish(dev, p, v, reserved);
}

/* A peer given access while a failed undo left chunks mapped: those chunks
 * are opened to it then, the others when the resume maps them, so after
 * the resume the peer reaches every chunk. Failed before: set_access
 * skipped every chunk of a paused pool, and the chunks still mapped never
 * came back through a map that would open them. */
Test(pool_pause, a_peer_given_while_paused_part_mapped_reaches_every_chunk) {
  mp_device_t *dev = flaky_open(2), *peer = flaky_peer_open();
  void *v[4];
  mp_pool_t *p = four_chunks(dev, v);
  size_t reserved = stats(p).reserved_bytes, capacity = fake_of(dev)->capacity;
  fake_of(dev)->capacity = reserved - MiB; /* as in the test above */
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_EDRIVER);
  cr_assert(mp__pool_is_paused(p));
  cr_assert_eq(p->pause_mapped, 3, "the test needs chunks still mapped");
  cr_assert_eq(mp_pool_set_access(p, peer), MP_OK, "%s", mp_last_error());
  for (size_t i = 0; i < 3; i++)
    cr_expect(open_to_peer((void *)p->vseg->chunks[i].addr),
              "chunk %zu, still mapped, is not open to the peer", i);
  fake_of(dev)->capacity = capacity;
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  for (size_t i = 0; i < 4; i++)
    cr_expect(open_to_peer((void *)p->vseg->chunks[i].addr),
              "after the resume chunk %zu is not open to the peer", i);
  for (unsigned i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  fake_pool_finish(p, dev);
  fake_close(peer);
}

/* A resume whose map fails (no room), and whose undo cannot unmap again
 * what it had mapped: the pool stays paused, knowing those chunks mapped,
 * and the next resume maps only the others. Failed before: the next
 * resume mapped them a second time (refused on a real device, the fake
 * charged them twice). */
/* A pool of four chunks paused, then a resume with room for two chunks
 * only, whose undo cannot unmap again the one it mapped (flaky_open(6): the
 * pause's four unmaps, then the undo's first): the pool stays paused with
 * one chunk mapped. The device's capacity before in *capacity, the pool's
 * reserved bytes before the pause in *reserved. */
static mp_pool_t *resume_undo_failed(mp_device_t **dev, void *v[4],
                                     size_t *reserved, size_t *capacity,
                                     const char *opts) {
  *dev = flaky_open(6);
  mp_pool_t *p = four_chunks_with(*dev, v, opts);
  *reserved = stats(p).reserved_bytes;
  *capacity = fake_of(*dev)->capacity;
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes, 0);
  cr_assert_eq(fake_of(*dev)->used, 0);
  fake_of(*dev)->capacity = 2 * 2 * MiB; /* room for two chunks */
  cr_assert_eq(mp_pool_resume(p), MP_ENOMEM);
  cr_assert(mp__pool_is_paused(p));
  cr_assert_eq(unmap_calls, 6,
               "the undo did not fail: the test proves nothing");
  return p;
}

Test(pool_pause, a_resume_whose_undo_fails_maps_the_rest_next_time) {
  mp_device_t *dev;
  void *v[4];
  size_t reserved, capacity;
  mp_pool_t *p = resume_undo_failed(&dev, v, &reserved, &capacity, NULL);
  cr_expect(strstr(mp_last_error(), "stays paused") != NULL, "%s",
            mp_last_error());
  fake_of(dev)->capacity = capacity;
  resume_and_finish(dev, p, v, reserved);
}

/* A failed undo leaves chunks mapped: the stats' reserved_bytes says what
 * the pool still holds on the device (free_bytes stays 0: a paused pool
 * serves nothing), after a failed pause and after a failed resume alike.
 * Failed before: reserved_bytes read 0 with chunks held. */
Test(pool_pause, a_pool_left_part_mapped_reports_the_bytes_it_holds) {
  mp_device_t *dev = flaky_open(2);
  void *v[4];
  mp_pool_t *p = four_chunks(dev, v);
  size_t reserved = stats(p).reserved_bytes, capacity = fake_of(dev)->capacity;
  fake_of(dev)->capacity = reserved - MiB; /* the pause's undo fails */
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_EDRIVER);
  cr_assert(mp__pool_is_paused(p));
  cr_assert_eq(fake_of(dev)->used, 3 * 2 * MiB, "three chunks still mapped");
  cr_expect_eq(stats(p).reserved_bytes, fake_of(dev)->used,
               "after the pause: %zu reserved", stats(p).reserved_bytes);
  cr_expect_eq(stats(p).segment_count, 3, "the chunks held now");
  cr_expect_eq(stats(p).free_bytes, 0);
  /* A resume with no room for the fourth chunk keeps the three. */
  cr_expect_eq(mp_pool_resume(p), MP_ENOMEM, "%s", mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes, fake_of(dev)->used,
               "after a failed resume: %zu reserved", stats(p).reserved_bytes);
  fake_of(dev)->capacity = capacity;
  resume_and_finish(dev, p, v, reserved);
}

/* The same after a resume whose undo fails: one chunk mapped of four. */
Test(pool_pause, a_resume_left_part_mapped_reports_the_bytes_it_holds) {
  mp_device_t *dev;
  void *v[4];
  size_t reserved, capacity;
  mp_pool_t *p = resume_undo_failed(&dev, v, &reserved, &capacity, NULL);
  cr_assert_eq(fake_of(dev)->used, 2 * MiB, "one chunk still mapped");
  cr_expect_eq(stats(p).reserved_bytes, fake_of(dev)->used, "%zu reserved",
               stats(p).reserved_bytes);
  cr_expect_eq(stats(p).free_bytes, 0);
  fake_of(dev)->capacity = capacity;
  resume_and_finish(dev, p, v, reserved);
}

/* Writes pool's snapshot into memory (*len bytes, the caller frees it). */
static char *snapshot_of(mp_pool_t *p, size_t *len) {
  char *buf = NULL;
  FILE *f = open_memstream(&buf, len);
  cr_assert_not_null(f);
  cr_assert_eq(mp_pool_snapshot_file(p, f), MP_OK, "%s", mp_last_error());
  fclose(f);
  return buf;
}

/* A pause whose undo failed leaves chunks mapped, and the stats count
 * them (reserved_bytes, segment_count): the snapshot lists that memory as
 * its segments and the dump's segment says it holds it, marked paused.
 * Failed before: the snapshot listed no segment (reserved_bytes said 6
 * MiB) and the dump's segment said the 8 MiB it held before the pause. */
/* A pool of four chunks with history whose pause fails at its second
 * unmap and whose undo cannot map the first back (no room): paused, with
 * three chunks mapped. The pool's reserved bytes before in *reserved, the
 * device's capacity before in *capacity. */
static mp_pool_t *pause_undo_failed(mp_device_t **dev, void *v[4],
                                    size_t *reserved, size_t *capacity) {
  *dev = flaky_open(2);
  mp_pool_t *p = four_chunks_with(*dev, v, "history=64");
  *reserved = stats(p).reserved_bytes;
  *capacity = fake_of(*dev)->capacity;
  fake_of(*dev)->capacity = *reserved - MiB; /* the pause's undo fails */
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_EDRIVER);
  cr_assert(mp__pool_is_paused(p));
  cr_assert_eq(p->pause_mapped, 3, "the test needs chunks still mapped");
  return p;
}

Test(pool_pause, a_pool_left_part_mapped_shows_what_it_holds_in_dumps) {
  mp_device_t *dev;
  void *v[4];
  size_t reserved, capacity;
  mp_pool_t *p = pause_undo_failed(&dev, v, &reserved, &capacity);
  mp_stats_t s = stats(p);
  cr_assert_eq(s.reserved_bytes, 3 * 2 * MiB, "three chunks still mapped");
  size_t len, n, np;
  char *snap = snapshot_of(p, &len);
  cr_expect_eq(snapshot_sum(snap, len, "total_size", &n), s.reserved_bytes,
               "the snapshot's segments");
  cr_expect_geq(n, 1);
  /* Blocks 0 to 2 lie in the chunks still mapped, live; block 3 not. */
  cr_expect_eq(snapshot_sum(snap, len, "allocated_size", &n), 3 * 2 * MiB);
  cr_expect_null(memmem(snap, len, "inactive", 8), "a block not live");
  free(snap);
  cr_expect_eq(json_dump_segments(p, &n, &np), s.reserved_bytes,
               "the dump's segments");
  cr_expect_eq(n, 1);
  cr_expect_eq(np, n, "the segment is not marked paused");
  fake_of(dev)->capacity = capacity;
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  snap = snapshot_of(p, &len);
  cr_expect_eq(snapshot_sum(snap, len, "total_size", &n), reserved);
  free(snap);
  cr_expect_eq(json_dump_segments(p, &n, &np), reserved);
  cr_expect_eq(np, 0, "a running pool's segment is marked paused");
  for (unsigned i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  fake_pool_finish(p, dev);
}

/* The same with a free block over two chunks, one left mapped and one
 * not: the snapshot cuts it at the top of what stays mapped (memory_viz
 * draws a block inside its segment). */
Test(pool_pause, a_block_over_the_top_of_what_stays_mapped_is_cut) {
  mp_device_t *dev = flaky_open(2);
  void *v[4];
  mp_pool_t *p = four_chunks_with(dev, v, "history=64");
  cr_assert_eq(mp_pool_free(p, v[3]), MP_OK);
  cr_assert_eq(mp_pool_free(p, v[2]), MP_OK);
  cr_assert_eq(p->vseg->nchunks, 4, "the frees unmapped a chunk");
  cr_assert_eq(p->vseg->last->addr, (uintptr_t)v[2]);
  cr_assert_eq(p->vseg->last->size, 2 * 2 * MiB,
               "the test needs one free "
               "block over two chunks");
  size_t reserved = stats(p).reserved_bytes, capacity = fake_of(dev)->capacity;
  fake_of(dev)->capacity = reserved - MiB; /* the pause's undo fails */
  cr_assert_eq(mp_pool_pause(p, 0), MP_EDRIVER);
  cr_assert(mp__pool_is_paused(p));
  cr_assert_eq(p->pause_mapped, 3);
  size_t len, n, nseg;
  char *snap = snapshot_of(p, &len);
  cr_expect_eq(snapshot_sum(snap, len, "total_size", &nseg), 3 * 2 * MiB);
  cr_expect_eq(snapshot_sum(snap, len, "allocated_size", &n), 2 * 2 * MiB);
  /* The blocks' sizes (before the trace, whose events have sizes too)
   * add up to the segments'. */
  const char *traces = memmem(snap, len, "device_traces", 13);
  cr_assert_not_null(traces);
  cr_expect_eq(snapshot_sum(snap, (size_t)(traces - snap), "size", &n),
               3 * 2 * MiB, "the blocks' sizes");
  cr_expect_eq(n, 3, "three blocks");
  free(snap);
  fake_of(dev)->capacity = capacity;
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(p, v[0]), MP_OK);
  cr_assert_eq(mp_pool_free(p, v[1]), MP_OK);
  fake_pool_finish(p, dev);
}

/* Replays the history's segment events (the ring has not wrapped): every
 * segment_map of a chunk not mapped, every segment_unmap of one mapped;
 * the chunks left mapped are the device's. The block events too, as
 * PyTorch's memory_viz needs them (python/tests/
 * test_snapshot_viewer_replay.py): a block allocated lies in a chunk
 * mapped, and no chunk is unmapped under a live block. */
static void expect_segment_history_replays(const mp_pool_t *p,
                                           mp_device_t *dev) {
  uintptr_t m[16], live[16];
  size_t msz[16], n = 0, nlive = 0, bytes = 0;
  const mp__history_t *h = &p->hist;
  cr_assert_leq(h->total, h->cap, "the test reads a ring that did not wrap");
  for (size_t i = 0; i < h->total; i++) {
    const mp__hevent_t *e = &h->ev[i];
    size_t k = 0;
    while (k < n && m[k] != e->addr)
      k++;
    if (e->action == MP__H_SEGMENT_MAP) {
      cr_assert_eq(k, n, "event %zu maps %#lx, mapped already", i,
                   (unsigned long)e->addr);
      cr_assert_lt(n, 16);
      msz[n] = e->size;
      m[n++] = e->addr;
      bytes += e->size;
    } else if (e->action == MP__H_SEGMENT_UNMAP) {
      cr_assert_lt(k, n, "event %zu unmaps %#lx, not mapped", i,
                   (unsigned long)e->addr);
      for (size_t j = 0; j < nlive; j++)
        cr_assert(live[j] < e->addr || live[j] >= e->addr + e->size,
                  "event %zu unmaps %#lx under the live block %#lx", i,
                  (unsigned long)e->addr, (unsigned long)live[j]);
      msz[k] = msz[n - 1];
      m[k] = m[--n];
      bytes -= e->size;
    } else if (e->action == MP__H_ALLOC) {
      size_t c = 0;
      while (c < n && (e->addr < m[c] || e->addr >= m[c] + msz[c]))
        c++;
      cr_assert_lt(c, n, "event %zu allocates %#lx in no chunk mapped", i,
                   (unsigned long)e->addr);
      cr_assert_lt(nlive, 16);
      live[nlive++] = e->addr;
    } else if (e->action == MP__H_FREE_COMPLETED) {
      size_t j = 0;
      while (j < nlive && live[j] != e->addr)
        j++;
      cr_assert_lt(j, nlive, "event %zu frees %#lx, not live", i,
                   (unsigned long)e->addr);
      live[j] = live[--nlive];
    }
  }
  cr_expect_eq(n, fake_of(dev)->nmap, "chunks: history %zu, device %zu", n,
               fake_of(dev)->nmap);
  cr_expect_eq(bytes, fake_of(dev)->used, "bytes: history %zu, device %zu",
               bytes, fake_of(dev)->used);
}

/* A resume whose undo failed keeps the chunk it could not unmap again:
 * the history says it was mapped again (segment_map), and the device
 * calls count it (device allocs less frees: the chunks held; a map the
 * undo took back is neither), so that the next resume's events, for the
 * other chunks only, leave a trace that replays to what the device
 * holds. Failed
 * before: no event and no count for that chunk; the trace had it
 * unmapped at the pause for good while the pool held it. */
Test(pool_pause, a_resume_left_part_mapped_records_the_chunk_it_kept) {
  mp_device_t *dev;
  void *v[4];
  size_t reserved, capacity;
  mp_pool_t *p =
      resume_undo_failed(&dev, v, &reserved, &capacity, "history=64");
  cr_assert_eq(fake_of(dev)->used, 2 * MiB, "one chunk still mapped");
  expect_segment_history_replays(p, dev);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.device_alloc_count - s.device_free_count, fake_of(dev)->nmap,
               "device allocs %llu less frees %llu, %zu chunks mapped",
               (unsigned long long)s.device_alloc_count,
               (unsigned long long)s.device_free_count, fake_of(dev)->nmap);
  size_t len, n, np;
  char *snap = snapshot_of(p, &len);
  cr_expect_eq(snapshot_sum(snap, len, "total_size", &n), 2 * MiB);
  free(snap);
  cr_expect_eq(json_dump_segments(p, &n, &np), 2 * MiB);
  fake_of(dev)->capacity = capacity;
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  expect_segment_history_replays(p, dev);
  s = stats(p);
  cr_expect_eq(s.device_alloc_count - s.device_free_count, fake_of(dev)->nmap,
               "device allocs %llu less frees %llu, %zu chunks mapped",
               (unsigned long long)s.device_alloc_count,
               (unsigned long long)s.device_free_count, fake_of(dev)->nmap);
  for (unsigned i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  fake_pool_finish(p, dev);
}

/* How many events of action the history holds (the ring has not
 * wrapped); *last: the address of the newest. */
static size_t history_count(const mp_pool_t *p, unsigned action,
                            uintptr_t *last) {
  size_t n = 0;
  *last = 0;
  for (size_t i = 0; i < p->hist.total && i < p->hist.cap; i++)
    if (p->hist.ev[i].action == action) {
      n++;
      *last = p->hist.ev[i].addr;
    }
  return n;
}

/* A pause whose undo failed unmapped one chunk of four: the history frees
 * only the block there before its segment_unmap, and the resume allocates
 * it again after its segment_map, so that no event leaves a block live in
 * unmapped memory (PyTorch's memory_viz throws on such a trace). Failed
 * before: the chunk was unmapped under its live block. */
Test(pool_pause, a_part_mapped_pause_records_only_the_blocks_it_unmapped) {
  mp_device_t *dev;
  void *v[4];
  size_t reserved, capacity;
  mp_pool_t *p = pause_undo_failed(&dev, v, &reserved, &capacity);
  expect_segment_history_replays(p, dev);
  uintptr_t at;
  cr_expect_eq(history_count(p, MP__H_FREE_COMPLETED, &at), 1);
  cr_expect_eq(at, (uintptr_t)v[3], "the block freed is not the unmapped one");
  fake_of(dev)->capacity = capacity;
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  expect_segment_history_replays(p, dev);
  cr_expect_eq(history_count(p, MP__H_ALLOC, &at), 5, "four blocks and one");
  cr_expect_eq(at, (uintptr_t)v[3], "the block allocated again");
  for (unsigned i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  fake_pool_finish(p, dev);
}

/* A capped pool reserves a virtual range for the device's size (a cap
 * may be raised later); where the address space cannot hold that, it
 * reserves one for its cap instead, and stays pausable. Sized from the
 * device only, the reservation failed and the pool went to plain
 * segments, which no pause can keep (MP_ENOTSUP). */
Test(pool_pause, a_capped_pool_short_of_address_space_still_pauses) {
  mp_device_t *dev = flaky_open(0);     /* 1 GiB, 2 MiB granules, unmaps work */
  fake_of(dev)->max_reserve = 64 * MiB; /* 2 x 1 GiB does not fit */
  mp_pool_t *p = make_pool(dev, "max_bytes=16M");
  void *x;
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &x), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->reserves, 2, "the device's size, then the cap's");
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  fake_close(dev);
}

/* A pausable pool (pausable=1) whose virtual range cannot be reserved at
 * all (an address space too short even for its cap's range) takes no
 * plain segment: the allocation fails, nothing taken; once the address
 * space allows, the next growth reserves the range and the pool pauses
 * with its block. Before, the failed reservation was final (vm_failed)
 * and the pool served from plain segments for good, which no pause can
 * keep: every pause with a block live was MP_ENOTSUP. With arenas too
 * (each reserves its range when it is made). */
static void pausable_short_of_address_space(const char *opts) {
  mp_device_t *dev = flaky_open(0);    /* 1 GiB, 2 MiB granules, unmaps work */
  fake_of(dev)->max_reserve = 2 * MiB; /* not even the cap's range fits */
  mp_pool_t *p = make_pool(dev, opts);
  void *x = NULL;
  mp_status_t st = mp_pool_alloc(p, MiB, NULL, &x);
  cr_expect_eq(st, MP_ENOMEM, "%s: served at %p (status %d)", opts, x, (int)st);
  cr_expect(strstr(opts, "arenas") != NULL ||
                strstr(mp_last_error(), "pausable") != NULL,
            "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 0, "%s: a plain segment was taken", opts);
  if (st == MP_OK)
    cr_assert_eq(mp_pool_free(p, x), MP_OK);
  fake_of(dev)->max_reserve = 0;
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &x), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s: %s", opts,
               mp_last_error());
  if (mp__pool_is_paused(p))
    cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  fake_pool_finish(p, dev);
}

Test(pool_pause,
     a_pausable_pool_short_of_address_space_takes_no_plain_segment) {
  pausable_short_of_address_space("max_bytes=16M,pausable=1");
  pausable_short_of_address_space("max_bytes=16M,pausable=1,arenas=2");
}

/* ---- a pause while the out-of-memory ladder holds a block --------------- */
/* Stream busy_s has work still running while busy: events recorded on it
 * then, and the stream itself, answer MP_EBUSY until a wait for one of
 * those events (or the stream) finishes the work. */
static mp_stream_t busy_s;
static bool busy;
static mp_event_t busy_ev[16];
static unsigned nbusy_ev;
static mp_pool_t *ladder_pool;
static void *ladder_b;   /* freed on busy_s in the first wait for an event */
static unsigned vm_maps; /* the second map sets the pool's syncing flag */
static mp_status_t ladder_free = MP_EINVAL; /* ladder_b's free */

static bool busy_pending(mp_event_t e) {
  for (unsigned i = 0; i < nbusy_ev; i++)
    if (busy_ev[i] == e)
      return busy;
  return false;
}

static mp_status_t busy_record(mp_device_t *d, mp_event_t e, mp_stream_t s) {
  (void)d;
  if (s == busy_s && busy && nbusy_ev < 16)
    busy_ev[nbusy_ev++] = e;
  return MP_OK;
}

static mp_status_t busy_query(mp_device_t *d, mp_event_t e) {
  (void)d;
  return busy_pending(e) ? MP_EBUSY : MP_OK;
}

static mp_status_t busy_stream_query(mp_device_t *d, mp_stream_t s) {
  (void)d;
  return s == busy_s && busy ? MP_EBUSY : MP_OK;
}

/* The ladder's synchronization (the lock dropped): b is freed on busy_s,
 * with more work queued there behind the free. */
static mp_status_t busy_wait(mp_device_t *d, mp_event_t e) {
  (void)d;
  if (busy_pending(e)) {
    busy = false;
    nbusy_ev = 0;
  }
  if (ladder_b != NULL) {
    void *b = ladder_b;
    ladder_b = NULL;
    busy = true;
    ladder_free = mp_pool_free(ladder_pool, b);
  }
  return MP_OK;
}

/* The ladder's growth after its synchronization and trim (the lock
 * dropped for the map): another thread's synchronization starts, as far
 * as the pool can tell; the map fails (the device is full). */
static mp_status_t busy_vm_map(mp_device_t *d, void *addr, size_t n) {
  if (ladder_pool != NULL && ++vm_maps == 2) {
    mp__pool_lock(ladder_pool);
    ladder_pool->syncing = true;
    mp__pool_unlock(ladder_pool);
  }
  return fake_vm_map(d, addr, n);
}

typedef struct {
  mp_pool_t *p;
  mp_stream_t s;
  mp_status_t st;
  void *x;
} ladder_t;

static void *alloc_2m(void *arg) {
  ladder_t *l = arg;
  l->st = mp_pool_alloc(l->p, 2 * MiB, l->s, &l->x);
  return NULL;
}

/* The ladder scenarios' device: stream work held busy (busy_s), growth
 * refused once the device is full; *s1 a second stream. */
static mp_pool_t *ladder_setup(mp_device_t **dev, mp_stream_t *s1) {
  *dev = flaky_open(0);
  flaky_backend.event_record = busy_record;
  flaky_backend.event_query = busy_query;
  flaky_backend.event_synchronize = busy_wait;
  flaky_backend.stream_query = busy_stream_query;
  flaky_backend.vm_map = busy_vm_map;
  mp_pool_t *p = make_pool(*dev, NULL);
  cr_assert_eq(mp_stream_create(*dev, s1), MP_OK);
  cr_assert_eq(mp_stream_create(*dev, &busy_s), MP_OK);
  return p;
}

/* Fills the device, starts l's 2 MiB allocation on a thread of its own and
 * returns once its ladder sleeps on a synchronization "in flight" (the
 * flag cleared without waking it, so it sleeps on through a pause). */
static void ladder_start(mp_device_t *dev, ladder_t *l, pthread_t *t) {
  fake_of(dev)->capacity = fake_of(dev)->used;
  ladder_pool = l->p;
  vm_maps = 0;
  cr_assert_eq(pthread_create(t, NULL, alloc_2m, l), 0);
  for (uint32_t waiting = 0; waiting == 0;) {
    mp__pool_lock(l->p);
    waiting = l->p->idle_waiters;
    if (waiting)
      l->p->syncing = false;
    mp__pool_unlock(l->p);
    if (!waiting)
      usleep(100);
  }
}

/* A ladder scenario: the device full with A (stream s1, live, a) and B
 * (busy_s, above A); l's 2 MiB request on s1 started (ladder_start) on
 * thread t: its ladder holds B. */
typedef struct {
  mp_device_t *dev;
  mp_pool_t *p;
  void *a;
  ladder_t l;
  pthread_t t;
} ladder_scene_t;

static void ladder_holding_b(ladder_scene_t *x) {
  mp_stream_t s1;
  x->p = ladder_setup(&x->dev, &s1);
  cr_assert_eq(mp_pool_alloc(x->p, 2 * MiB, s1, &x->a), MP_OK);
  cr_assert_eq(mp_pool_alloc(x->p, 2 * MiB, busy_s, &ladder_b), MP_OK);
  x->l = (ladder_t){x->p, s1, MP_OK, NULL};
  ladder_start(x->dev, &x->l, &x->t);
}

/* After the ladder ended: frees what it and A hold, and the pool. */
static void ladder_finish(ladder_scene_t *x) {
  if (x->l.st == MP_OK)
    cr_assert_eq(mp_pool_free(x->p, x->l.x), MP_OK);
  cr_assert_eq(mp_pool_free(x->p, x->a), MP_OK);
  cr_assert_eq(mp_stream_synchronize(x->dev, busy_s), MP_OK);
  fake_pool_finish(x->p, x->dev);
}

/* The last rung of the out-of-memory ladder takes a block another stream's
 * newer work holds and keeps it live (in the map, counted allocated) while
 * it waits for the streams. Its synchronization first waits for the one in
 * flight, with the lock dropped, and a pause may run then: it saved the
 * free bytes without that block, and the ladder, giving the block back
 * while the pool was paused, added it to the figures the pause had zeroed.
 * After the resume the pool counted less free memory than its free blocks
 * hold. Here: the device full with A (stream s1, live) and B (busy_s); a
 * 2 MiB request on s1; B freed on busy_s during the ladder's
 * synchronization, with newer work behind it; the ladder's growth fails;
 * its last rung takes B and waits for a synchronization "in flight" (the
 * flag set white-box), cleared without waking it; the pause runs. */
Test(pool_pause, a_pause_while_the_ladder_holds_a_block_keeps_the_figures,
     .timeout = 20) {
  ladder_scene_t x;
  ladder_holding_b(&x);
  cr_assert_eq(mp_pool_pause(x.p, 0), MP_OK, "%s", mp_last_error());
  pthread_join(x.t, NULL);
  cr_expect_eq(ladder_free, MP_OK, "B freed during the ladder's wait");
  /* EBUSY: it ended in the paused pool. (A spurious wake-up before the
   * pause could let it take B first: MP_OK, nothing then tested.) */
  cr_expect(x.l.st == MP_EBUSY || x.l.st == MP_OK, "%d", x.l.st);
  cr_assert_eq(mp_pool_resume(x.p), MP_OK, "%s", mp_last_error());
  check(x.p);
  mp_stats_t s = stats(x.p);
  cr_expect_eq(s.free_bytes, x.l.st == MP_EBUSY ? 2 * MiB : 0);
  ladder_finish(&x);
}

/* The same scenario, a snapshot taken while the ladder holds B: B is no
 * caller's, freed and waiting for the streams before it is reused, which
 * PyTorch calls active_pending_free (torch/csrc/cuda/memory_snapshot.cpp;
 * CUDACachingAllocator.cpp's snapshot() calls a block active while its
 * reuse waits for events). It showed as active_allocated, one more
 * allocation than the program holds. */
Test(pool_pause, a_snapshot_while_the_ladder_holds_a_block_shows_it_pending,
     .timeout = 20) {
  ladder_scene_t x;
  ladder_holding_b(&x);
  mp__pool_lock(x.p);
  size_t held = x.p->nladder;
  mp__pool_unlock(x.p);
  size_t len, n;
  char *snap = snapshot_of(x.p, &len);
  if (held == 1) { /* else a spurious wake-up: nothing to see */
    cr_expect_eq(snapshot_str_count(snap, len, "active_allocated"), 1);
    cr_expect_eq(snapshot_str_count(snap, len, "active_pending_free"), 1);
    cr_expect_eq(snapshot_sum(snap, len, "allocated_size", &n), 2 * MiB);
    cr_expect_eq(snapshot_sum(snap, len, "active_size", &n), 4 * MiB);
  }
  free(snap);
  cr_assert_eq(mp_pool_pause(x.p, 0), MP_OK, "%s", mp_last_error());
  pthread_join(x.t, NULL);
  cr_assert_eq(mp_pool_resume(x.p), MP_OK, "%s", mp_last_error());
  check(x.p);
  ladder_finish(&x);
}

/* The same scenario with the content kept, and the ladder's block B below
 * A. The pause copied B (live then, taken by the ladder) and A to the host
 * in address order; the ladder gave B back while the pool was paused, and
 * the resume, listing the live blocks anew, found A alone and copied the
 * first bytes of the host copy, B's, into it: A came back holding what
 * lay in B. Now the ladder's block is never copied (its content is
 * nobody's: free memory on its way to becoming a new allocation), at the
 * pause or the resume. */
Test(pool_pause, a_keep_content_pause_while_the_ladder_holds_a_block_keeps_data,
     .timeout = 20) {
  mp_device_t *dev;
  mp_stream_t s1;
  mp_pool_t *p = ladder_setup(&dev, &s1);
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, busy_s, &ladder_b), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, s1, &a), MP_OK);
  cr_assert((uintptr_t)ladder_b < (uintptr_t)a, "the test needs B below A");
  fill(ladder_b, 2 * MiB, 0);
  fill(a, 2 * MiB, 1);
  ladder_t l = {p, s1, MP_OK, NULL};
  pthread_t t;
  ladder_start(dev, &l, &t);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  pthread_join(t, NULL);
  cr_expect_eq(ladder_free, MP_OK, "B freed during the ladder's wait");
  cr_expect(l.st == MP_EBUSY || l.st == MP_OK, "%d", l.st);
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  check(p);
  size_t at = first_difference(a, 2 * MiB, 1);
  cr_expect_eq(at, 2 * MiB, "A lost its content from byte %zu (holds 0x%x)", at,
               at < 2 * MiB ? ((unsigned char *)a)[at] : 0);
  if (l.st == MP_OK)
    cr_assert_eq(mp_pool_free(p, l.x), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, busy_s), MP_OK);
  fake_pool_finish(p, dev);
}

/* A freeze while the out-of-memory ladder holds a block fences only what
 * the program holds live. It fenced the ladder's block too (in the live
 * map, no caller's: free memory on its way to becoming an allocation),
 * and when the ladder gave the block back (its allocation failed) the
 * fence stayed above free memory that had never been live: no
 * defragmentation moved a block into it again. Here: A (s1, live) and B
 * (busy_s) fill the device, B above A; the ladder of a 2 MiB request on s1
 * holds B, waiting; the freeze runs (nothing to move: no synchronization
 * of its own); a pause ends the ladder (MP_EBUSY), a resume. Then F takes
 * B's space, a movable block H is grown above it, F is freed: a
 * defragmentation slides H down into B's space, above the fence. */
Test(pool_pause, a_freeze_while_the_ladder_holds_a_block_fences_only_live_ones,
     .timeout = 20) {
  mp_device_t *dev;
  mp_stream_t s1;
  mp_pool_t *p = ladder_setup(&dev, &s1);
  void *a, *b, *f;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, s1, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, busy_s, &ladder_b), MP_OK);
  b = ladder_b;
  cr_assert_eq((char *)b, (char *)a + 2 * MiB, "the test needs B above A");
  ladder_t l = {p, s1, MP_OK, NULL};
  pthread_t t;
  ladder_start(dev, &l, &t);
  mp__pool_lock(p);
  mp__block_t *held = mp__map_find(p, (uintptr_t)b);
  bool by_ladder = held != NULL && (held->flags & MP__B_LADDER);
  mp__pool_unlock(p);
  cr_assert(by_ladder, "the ladder holds B while it waits");
  cr_assert_eq(mp_pool_freeze(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_pause(p, 0), MP_OK, "%s", mp_last_error());
  pthread_join(t, NULL);
  cr_assert_eq(ladder_free, MP_OK, "B freed during the ladder's wait");
  cr_assert_eq(l.st, MP_EBUSY, "the ladder ended in the paused pool: %d", l.st);
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  check(p);
  cr_expect_eq(p->vseg->fence, (uintptr_t)a + 2 * MiB,
               "the fence at A's top, not B's (%#lx above A)",
               (unsigned long)(p->vseg->fence - (uintptr_t)a));
  fake_of(dev)->capacity = fake_of(dev)->used + 2 * MiB;
  mp_handle_t *h;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, s1, &f), MP_OK, "%s", mp_last_error());
  cr_assert_eq(f, b, "F takes B's space");
  cr_assert_eq(mp_pool_alloc_movable(p, 2 * MiB, s1, &h), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_handle_ptr(h), (char *)b + 2 * MiB, "H above F");
  cr_assert_eq(mp_pool_free(p, f), MP_OK);
  size_t moved = 0;
  cr_assert_eq(mp_pool_defragment(p, s1, &moved), MP_OK, "%s", mp_last_error());
  cr_expect_eq(moved, 2 * MiB, "H slid into B's space: %zu bytes moved", moved);
  cr_expect_eq(mp_handle_ptr(h), b);
  check(p);
  cr_assert_eq(mp_handle_free(h), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, busy_s), MP_OK);
  fake_pool_finish(p, dev);
}
