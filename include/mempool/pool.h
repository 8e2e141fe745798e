/* mempool/pool.h - the caching best-fit pool.
 *
 * A pool serves device memory from a cache of segments it got from the
 * device. Free blocks sit in size-class free lists indexed by a two-level
 * bitmap (TLSF-style), so finding the best fit costs the same with 10 or
 * 100 000 blocks; within a class the smallest block that fits wins, lowest
 * address on ties. Block records are host structures, never written into
 * device memory.
 *
 * Within a class, blocks are kept in a treap ordered by (size, address),
 * so the best fit costs O(log m) expected for m blocks in that class. The
 * rest of a block is split off when it is at least min(size/16, 1 MiB);
 * a smaller sliver stays with the block and counts as allocated.
 *
 * Growth policy (keeps reserved memory close to live memory):
 *  - virtual (MP_POOL_VIRTUAL and a device with virtual memory): one address
 *    range is reserved once (the cap's size) and holds mapped chunks (each
 *    exactly one vm_map) with unmapped holes between them; blocks never span
 *    a hole. Growth maps where the new memory best completes a fitting
 *    block: into a hole next to free blocks (mapping only what they lack),
 *    else at the top, sized max(what the free top block lacks,
 *    segment_bytes, reserved/128 up to 16 MiB), rounded to the granule.
 *    Before a growth that would lift reserved above its peak, a pool used
 *    from one stream unmaps free chunks anywhere in the range first
 *    ("reclaim, then grow"; when they still wait for that stream's work it
 *    asks once whether the stream is idle, and grows if not: an
 *    allocation never waits for work it cannot know will finish); trim
 *    unmaps free chunks anywhere.
 *  - plain: requests up to segment_bytes/2 come from segment_bytes
 *    segments (default 2 MiB); larger ones get their own segment, rounded
 *    up to 2 MiB. Trim frees segments that are wholly free.
 *  Near the cap, growth asks for the exact need instead.
 *
 * Streams: a block is reusable at once on the stream it was allocated on;
 * on another stream only once every use recorded for it (its own stream at
 * the free, and every stream given to mp_pool_record_stream) has completed.
 * The pool learns completion through marker events it records on those
 * streams (from a per-pool event cache): at each free once it has seen a
 * second stream, and lazily otherwise, so a pool used from one stream makes
 * no device call on alloc/free. Free blocks of every stream sit in one
 * index, so idle memory of one stream serves the others. An allocation
 * that finds only blocks still pending on other streams waits up to 200 us
 * for their markers before it grows. Streams used with a pool must stay
 * valid while blocks freed on them are cached (until mp_pool_trim or
 * mp_pool_destroy), as the pool may record a marker on them.
 *
 * Out of memory is a ladder: cache -> grow -> reclaim blocks whose streams
 * have finished -> synchronize, trim free segments, retry -> (pools with
 * movable blocks) defragment -> MP_ENOMEM, or MP_ELIMIT where the pool's own
 * cap stops it. mp_last_error() then says how much was asked, reserved and
 * allocated and how big the largest free block was.
 *
 * From a host function (mp_stream_launch_host; CUDA's cuLaunchHostFunc: it
 * "must not make any CUDA API calls") no call waits for the device or for
 * another thread's device call on the pool, which may be waiting for the
 * host functions queued: the ladder runs only the rungs that neither wait
 * nor call the device (MP_ELIMIT at the cap, else the device's refusal);
 * mp_pool_trim, mp_pool_defragment, mp_pool_freeze, mp_pool_pause,
 * mp_pool_resume and mp_pool_set_access are refused before anything
 * changes; mp_pool_check, mp_pool_dump and mp_pool_snapshot answer
 * MP_EBUSY while such a call is under way. Where the device cannot tell a
 * host function's thread (CUDA), none of this applies: make no pool call
 * there that may grow, trim or wait. Likewise a parent's out-of-memory
 * handler, run inside a graph pool's growth, may check, dump or snapshot
 * that graph pool (as it was before the growth), but an allocation from
 * it and those six calls on it are MP_EBUSY.
 *
 * All calls are thread-safe: one lock per pool, never held across a device
 * call that can block (allocation, mapping, release, synchronize). */
#ifndef MEMPOOL_POOL_H
#define MEMPOOL_POOL_H

#include <stddef.h>
#include <stdio.h>

#include <mempool/device.h>
#include <mempool/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_pool mp_pool_t;

/* mp_pool_config_t.flags */
/* Grow one reserved virtual range by mapping granules where the device
 * supports virtual memory, so free neighbours always coalesce and trim can
 * unmap free granules; otherwise (or without this flag) segments are plain
 * device allocations. On by default. */
#define MP_POOL_VIRTUAL 0x1u
/* Defragment movable blocks as a rung of the out-of-memory ladder. On by
 * default. */
#define MP_POOL_DEFRAG_ON_OOM 0x2u
/* With history: record the allocating thread's stack (raw return addresses
 * from backtrace(); symbolized only when a snapshot is written), each
 * event's starting at the caller of the call that made it (mp_pool_free,
 * mp_handle_free, mp_pool_create_child, mp_pool_destroy of a child,
 * mp_pool_defragment, mp_pool_pause, mp_pool_graph_release, ...). Option
 * history_stacks=1; needs history > 0. Off by default. */
#define MP_POOL_HISTORY_STACKS 0x4u
/* Stream waits (option stream_waits=1): a free block that another stream's
 * queued work may still use is handed to the allocating stream at once,
 * after making that stream wait on the device for the work (an event the
 * pool recorded at the free, cuStreamWaitEvent), instead of being passed
 * over until the work completes. As CUDA's own pools do by default
 * (CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, cuda.h). Which block
 * an allocation gets then no longer depends on how far the streams have
 * run, at the price of the new dependency between the two streams. Never
 * on a stream being captured. Off by default: with it on, a program that
 * holds one stream back on a condition of its own (a kernel waiting for a
 * flag or a peer, a host function waiting for the host) and then waits for
 * another stream can deadlock, where without it the pool would grow. */
#define MP_POOL_STREAM_WAITS 0x8u
/* Pausable (option pausable=1): a pool on its virtual range that must stay
 * pausable (mp_pool_pause; sleep mode) never takes a plain segment. Near a
 * cap that is no whole number of granules, a request that whole granules
 * no longer fit under it, but the request itself would, is MP_ELIMIT
 * (without the flag it gets a plain segment of its own size, which no
 * pause can keep while a block in it is live); the cap is then used in
 * whole granules. Likewise a request the range cannot place (it is twice
 * the cap or the device: rare) is MP_ENOMEM, and so is a growth while the
 * range cannot be reserved (the address space short; the next growth
 * tries again). It needs the virtual range:
 * with virtual=0 (no MP_POOL_VIRTUAL) mp_pool_create is MP_EINVAL, and on
 * a device without virtual memory MP_ENOTSUP, the message saying why (a
 * pool of plain segments could never pause). Off by default. */
#define MP_POOL_PAUSABLE 0x10u
/* Arenas on contention (option arenas_auto=1, with arenas=N, N at least 2):
 * the pool runs solo on its first arena, the one the first allocation
 * makes for its thread, which every thread then uses as a pool without
 * arenas is used (no thread-local lookup, no arena table: the instructions
 * of a pool without arenas); it switches to per-thread arenas for good
 * once threads contend for that arena's lock (a few dozen contended
 * takes), or another arena is made (another thread's first allocation
 * before solo began, mp_pool_alloc_contiguous, mp_pool_alloc_movable or a
 * child pool's range from a thread whose arena is another). From then on
 * it is a pool with arenas=N ("Arenas" below), but that the first thread
 * keeps its arena with what it holds and still allocates and frees there
 * through the path of a pool without arenas (a free of another arena's
 * block is found there too). Every other call works on it as on a pool
 * with arenas from the start. A graph pool made of it ends solo, and that
 * first thread's path, for good, or keeps solo from starting (the arenas'
 * path routes a captured stream to it). Solo does not start with
 * history=N or a release threshold (their pools take no plain path
 * anyway). Off by default. */
#define MP_POOL_ARENAS_AUTO 0x20u

typedef struct mp_pool_config {
  size_t
      max_bytes; /* cap on reserved device memory; 0: the device's capacity */
  size_t align;  /* every block's address and size, a power of two up to
                    the device's own alignment (2 MiB; 4 KiB with vmm=0)
                    and 1 GiB, else MP_EINVAL at create; 0: 512 */
  size_t segment_bytes; /* smallest device allocation the pool makes; 0: its
                           default */
  size_t max_split;     /* a free block above this is never split for a smaller
                           request; 0: no limit. In a virtual range the
                           limit is at least segment_bytes rounded to the
                           granule; memory grown for a small request is
                           kept apart from free neighbours it would push
                           above it, and big free blocks go back to the
                           device through reclaim and trim */
  unsigned flags;       /* MP_POOL_* bits */
  size_t history;       /* events the history ring keeps (option history=N, at
                           most 2^24); 0: no history (the default) */
  size_t release_threshold; /* idle memory the pool keeps: above it, free
                               chunks whose streams are done go back to the
                               device as frees happen, without a trim call
                               (cudaMemPoolAttrReleaseThreshold, PyTorch's
                               garbage_collection_threshold); 0: keep all
                               until trim (the default) */
  double max_fraction;      /* cap as a fraction (0, 1] of the device's memory
                               (option max_fraction=0.5; PyTorch's
                               per_process_memory_fraction); 0: none. With
                               max_bytes: MP_EINVAL, give one */
  double release_fraction;  /* release_threshold as a fraction (0, 1) of the
                               memory the pool may hold (option
                               garbage_collection_threshold=0.8, PyTorch's
                               name), fixed when the pool is made:
                               fraction x max_bytes, or x max_fraction of the
                               device's memory, or, without a cap, x the
                               device's memory (PyTorch's allowed memory is
                               the device's total x
                               per_process_memory_fraction). A device that
                               does not tell its size: MP_EINVAL at create.
                               PyTorch frees cached blocks once reserved
                               memory passes it; here idle memory above it
                               goes back. With release_threshold: MP_EINVAL,
                               give one. 0: none (the default) */
  size_t struct_size;       /* sizeof(mp_pool_config_t) of the header the caller
                               was built against: mp_pool_config_init sets it;
                               0 (a config made without it): MP_POOL_CONFIG_SIZE_V1.
                               See "Growing" below */
  size_t arenas;            /* per-thread arenas (option arenas=N, at most
                               MP_POOL_MAX_ARENAS); 0: none (the default).
                               With N > 0 each thread allocates from one of N
                               private sub-pools (its arena, picked once per
                               thread), so threads sharing the pool do not
                               share its lock or its data; frees from any
                               thread go to the owning arena. See "Arenas"
                               below */
  size_t map_piece; /* largest device mapping growth makes in the virtual
                       range (option map_piece=2M, rounded up to the
                       granule); 0: one mapping per growth (the default).
                       Memory goes back to the device (trim, the reclaim
                       before growing past the peak) only as whole
                       mappings, so smaller pieces give back more of a
                       partly used range, for more device calls. A block
                       spanning pieces cannot be exported
                       (mp_pool_ipc_export: MP_ENOTSUP). With virtual=0:
                       MP_EINVAL at create (plain segments are one
                       allocation each); on a device without virtual
                       memory it does nothing. README, "Mapping in
                       pieces" */
} mp_pool_config_t;
#define MP_POOL_MAX_ARENAS 64

/* Arenas (arenas=N): a pool shared by threads that allocate at the same
 * time. Each arena is an ordinary pool of its own (lock, free index, live
 * map, virtual range) made on first use; a thread takes arena (k mod N),
 * k counting the threads that ever used one. Fragmentation is that of a
 * pool per thread, but for large requests (2 MiB and up): before its arena
 * grows for one, a thread takes a fitting block that an idle arena (at
 * least half of what it reserved free, its lock free at that moment; an
 * allocation about to fail asks again, waiting) caches, so memory one thread
 * freed serves another thread's next large request; the block stays in the
 * arena that holds it. With arenas_auto=1 (MP_POOL_ARENAS_AUTO) the
 * first arena made (the first allocating thread's) serves every thread
 * through the path of a pool without arenas until threads contend for its
 * lock; then the pool works as below, the first thread keeping that path on
 * its arena. What works on the pool as a whole:
 *  - mp_pool_alloc, mp_pool_free, mp_pool_free_async,
 *    mp_pool_free_after_all, mp_pool_record_stream: from any thread; a
 *    free goes to the arena that holds the pointer. free_after_all waits
 *    for the streams the owning arena knows (those it served, and every
 *    stream given to mp_pool_add_stream).
 *  - an arena that runs out (MP_ENOMEM, MP_ELIMIT) trims the other arenas'
 *    cache, takes back their unused share of the cap, and retries before
 *    failing; then the pool's out-of-memory handler runs (with the pool).
 *  - max_bytes / max_fraction cap the sum of the arenas' reserved bytes:
 *    each arena holds a share of the cap, handed out and taken back under
 *    the pool's lock only when an arena reaches its share. Free memory
 *    split among arenas cannot serve one request, so near a tight cap an
 *    allocation may fail where a pool without arenas would fit it (the
 *    fragmentation of a pool per thread).
 *  - mp_pool_trim and mp_pool_get_stats / mp_pool_reset_peaks /
 *    mp_pool_mem_info / mp_pool_check cover every arena. Stats are sums;
 *    peaks are sums of each arena's peak (at least the true peak of the
 *    sum: arenas peak at different times), largest_free_bytes is the
 *    largest of any arena. release_threshold is split evenly among them.
 *  - mp_pool_snapshot shows every arena's segments and blocks (the pool
 *    itself holds none).
 *  - mp_pool_pause / mp_pool_resume pause and resume every arena made, as
 *    "Pause and resume" below says of a pool, and all or nothing: a pause
 *    failing in one arena resumes the arenas it paused, a resume failing
 *    in one unmaps those it mapped (the pool stays paused, every host copy
 *    kept). While paused, the calls refused there are MP_EBUSY from any
 *    thread, and a thread with no arena yet gets none (its allocation is
 *    MP_EBUSY). A resume lets the arenas run one after another once all
 *    are mapped again; under a cap, an arena running meanwhile counts one
 *    still paused at what it reserved before the pause (what its resume
 *    maps back), not at its whole share.
 *  - mp_pool_freeze freezes every arena made as a pool of its own (its
 *    movable blocks move down, then what it holds live is fenced);
 *    paused: MP_EBUSY.
 *  - mp_pool_alloc_movable: the block comes from the calling thread's
 *    arena (or a loan, with the out-of-memory path above), and its handle
 *    names the arena holding it; mp_pool_defragment defragments every
 *    arena made in turn (moved_bytes: their sum); paused: MP_EBUSY.
 *  - mp_pool_set_access gives the peer to every arena made and to every
 *    arena made later (paused too, for the resume), all or nothing: a
 *    device refusing it in one arena takes it back from the arenas that
 *    got it, and the pool is as it was. Calls from two threads at once
 *    run one after the other.
 *  - mp_pool_dump: the stats as mp_pool_get_stats sums them, every arena's
 *    segments (each naming its arena: " arena i" in text, "arena":i in
 *    JSON) and blocks, and the free lists of all arenas by class; each
 *    arena is read under its own lock in turn.
 *  - mp_pool_set_max_fraction moves the cap of the sum: every arena gives
 *    its share back and asks for one of the new cap at its next growth.
 *    Lowered below what the arenas hold, nothing is given back, and no
 *    arena grows until enough goes back.
 *  - mp_pool_alloc_contiguous: the pieces come from the calling thread's
 *    arena (with the out-of-memory path above); any thread frees them.
 *  - mp_pool_create_child: the range is a block of the calling thread's
 *    arena (or one an idle arena lends, with the out-of-memory path
 *    above); while the child lives, mp_pool_destroy and mp_pool_pause of
 *    the pool are MP_EBUSY and change nothing, and so is mp_pool_pause
 *    while another thread is making one.
 *  - mp_pool_ipc_export goes to the arena holding the block, from any
 *    thread; mp_pool_ipc_poll polls every arena and sums what they hold.
 *    A held block whose importers let go goes back at the next poll, trim
 *    or free of an exported block, or when its arena misses its cache.
 *  - history=N: each arena keeps a ring of N events of its own (the pool
 *    itself records nothing), and mp_pool_snapshot merges them by time
 *    into one trace. An arena asking for its share of the cap is no oom
 *    event; an allocation that fails is one, in the calling thread's
 *    arena. With history_stacks=1 each event's stack starts at the caller
 *    of the pool's entry point, as without arenas.
 *  - Graph pools (mp_pool_graph_create of the pool): a graph pool is one
 *    pool, whose ranges the calling thread's arena lends (with the
 *    out-of-memory path above). mp_pool_graph_begin marks the stream
 *    capturing in every arena, those made later included, so that an
 *    allocation on it from any thread comes from the graph pool and no
 *    arena records on it or waits for it; meanwhile the arenas' caches are
 *    looked at on their slower path. A free of graph memory through the
 *    pool, from any thread, reaches the graph pool through the arena that
 *    lent the range, and the release gives each range back to its arena.
 *    While a graph pool lives, mp_pool_destroy and mp_pool_pause of the
 *    pool are MP_EBUSY and change nothing. */

/* Growing: mp_pool_config_t only ever gains fields at its end, after
 * struct_size, so struct_size sits at the same place in every layout that
 * has it. mp_pool_config_init, as the caller's header names it, writes
 * sizeof(mp_pool_config_t) as that header knows it (it names the symbol of
 * that layout: mp_pool_config_init_v3 below), and mp_pool_config_init_sized
 * takes the size: each writes exactly that many bytes and records the
 * size in struct_size;
 * mp_pool_config_parse and mp_pool_create then read and write only
 * struct_size bytes, and a field a shorter struct lacks takes what
 * mp_pool_config_init gives it: its default (0 for every field appended so
 * far), or the value $MEMPOOL_CONF names, read when the pool is made (a bad
 * $MEMPOOL_CONF: the default); an option given to mp_pool_config_parse for
 * it is MP_EINVAL. So a program built
 * against an older header keeps working with a newer library. A struct_size
 * this library does not know (smaller than MP_POOL_CONFIG_SIZE_V1, not on a
 * field's end, or from a newer header than the library) is MP_EINVAL, names the
 * sizes it knows in mp_last_error(), and changes nothing. The symbol
 * mp_pool_config_init itself (a program built before the header named
 * another, or another language) writes MP_POOL_CONFIG_SIZE_V1 bytes: the
 * struct as it was when struct_size came. A config filled by hand keeps
 * struct_size 0 and reads as V1: to use a field appended after V1, set
 * struct_size = sizeof(mp_pool_config_t) (or start from mp_pool_config_init).
 */
#define MP_POOL_CONFIG_SIZE_V1                                                 \
  (offsetof(mp_pool_config_t, struct_size) + sizeof(size_t))

/* Defaults, then $MEMPOOL_CONF overrides ("max_bytes=8G,align=512,..."). A
 * bad $MEMPOOL_CONF leaves the defaults and marks the config with
 * MP_POOL_CONFIG_BAD_ENV in struct_size (a bit no size has, kept whatever
 * the caller then sets in the other fields): mp_pool_config_parse and
 * mp_pool_create refuse a config so marked (MP_EINVAL, the message naming
 * the bad pair), as mp_pool_create(dev, NULL) refuses. */
MP_API void mp_pool_config_init(mp_pool_config_t *cfg);
/* mp_pool_config_init for a caller whose mp_pool_config_t is size bytes:
 * MP_EINVAL (cfg NULL, or a size this library does not know) writes
 * nothing. */
MP_API mp_status_t mp_pool_config_init_sized(mp_pool_config_t *cfg,
                                             size_t size);
/* The third layout of mp_pool_config_t (up to map_piece), this header's:
 * a program built with it calls this symbol, by the name
 * mp_pool_config_init (an object-like macro, so the name keeps API.md's
 * prototype: it can be declared again, its address taken). The symbol
 * mp_pool_config_init itself (a program built against an older header, or
 * another language) writes MP_POOL_CONFIG_SIZE_V1 bytes. When a field is
 * appended, a _v4 comes and this one keeps writing its own bytes. */
MP_API void mp_pool_config_init_v3(mp_pool_config_t *cfg);
#define mp_pool_config_init    mp_pool_config_init_v3
#define MP_POOL_CONFIG_BAD_ENV ((size_t)1 << (sizeof(size_t) * 8 - 1))
/* sizeof(mp_pool_config_t) as this library was built: for callers from
 * another language (Python's ctypes), which hold at least that many bytes
 * and pass it to mp_pool_config_init_sized, to reach every option. */
MP_API size_t mp_pool_config_sizeof(void);
/* Applies a "key=value,key=value" string on top of cfg. Unknown keys, bad
 * values and keys whose field lies past cfg's struct_size (a config made
 * for an older header, or by the mp_pool_config_init symbol) are
 * MP_EINVAL, name the culprit in mp_last_error(), and leave cfg
 * unchanged. */
MP_API mp_status_t mp_pool_config_parse(mp_pool_config_t *cfg,
                                        const char *options);
/* The option keys, from the one table the parser reads: the i-th key's
 * name, NULL past the last (aliases such as PyTorch's names included). */
MP_API const char *mp_pool_config_key_name(size_t i);
/* Writes every option key with what it takes and what it means: format
 * "text" (NULL; as mpbench --help prints it) or "markdown" (a table, as the
 * README shows it). A write that fails: MP_EIO. */
MP_API mp_status_t mp_pool_config_help(FILE *out, const char *format);

/* cfg NULL: defaults (mp_pool_config_init). */
MP_API mp_status_t mp_pool_create(mp_device_t *dev, const mp_pool_config_t *cfg,
                                  mp_pool_t **out);
/* Lets device peer (another device of the same kind, e.g. "cuda:1") read
 * and write the pool's memory: every chunk mapped now and every chunk
 * mapped later (PyTorch's expandable segments do the same per peer;
 * cudaDeviceEnablePeerAccess does not cover virtual-memory mappings). The
 * pool's own device, or a peer already added: MP_OK, nothing to do. A
 * peer of another kind: MP_EINVAL. At most 32 peers. A chunk the device
 * refuses (MP_EDRIVER): the chunks opened before it are closed again, and
 * the pool is as it was. Plain segments
 * (cuMemAlloc memory) follow the contexts' peer access instead. */
MP_API mp_status_t mp_pool_set_access(mp_pool_t *pool, mp_device_t *peer);

/* What a program that allocates only from this pool may still get, as
 * cudaMemGetInfo would say it: total is the device's memory, or the cap
 * (max_bytes, max_fraction) when lower; free is the device's free memory
 * plus the pool's idle cache, and at most what the cap leaves above the
 * pool's live blocks. Either output may be NULL. */
MP_API mp_status_t mp_pool_mem_info(mp_pool_t *pool, size_t *free_bytes,
                                    size_t *total_bytes);
/* Changes the cap to fraction (0, 1] of the device's memory, as
 * max_fraction does at create (PyTorch's set_per_process_memory_fraction);
 * 0 lifts it. Memory reserved above a new, lower cap stays until trimmed;
 * growth stops there. Not in [0, 1], or a child or graph pool: MP_EINVAL. */
MP_API mp_status_t mp_pool_set_max_fraction(mp_pool_t *pool, double fraction);
/* MP_EBUSY for a default pool (mp_default_pool's, the torch hooks': it
 * lives until the process exits), while a child pool lives, while a block of a
 * plain segment is still imported by another process (see IPC below; the
 * message names the block; destroy after the importer closes it), or while a
 * stream the pool knows is captured without its knowledge (its work cannot be
 * waited for; destroy after the capture ends); else synchronizes the streams
 * that used the pool, releases everything and frees the pool. A refusal, or a
 * synchronization that fails (called from a host function), changes
 * nothing: the pool stays as it was. So does a device that refuses the
 * first free of a plain segment (made before anything else is given up):
 * its status, the segment named. A free refused after others went, or an
 * unmap or release of the pool's virtual range refused, is still reported
 * (its status, what was refused named and the other refusals counted), but
 * the pool is then destroyed and that memory lost to it. */
MP_API mp_status_t mp_pool_destroy(mp_pool_t *pool);
/* mp_pool_destroy that also says whether the pool is gone: *destroyed is 1
 * when the pool was destroyed (its handle must not be used again), also on
 * a failure reported after the release began (a device free refused after
 * others went: the status is that failure's), and 0 when the pool stays as
 * it was (every refusal above). A graph pool (mp_pool_graph_create) is
 * released, as mp_pool_destroy does: 1 on MP_OK. destroyed may be NULL. */
MP_API mp_status_t mp_pool_destroy_ex(mp_pool_t *pool, int *destroyed);

/* 0 bytes: MP_OK with *out = NULL. */
MP_API mp_status_t mp_pool_alloc(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                                 void **out);
/* Stream-ordered on the block's stream. NULL: MP_OK and nothing happens. A
 * pointer the pool did not hand out, or one already freed: MP_EINVAL. */
MP_API mp_status_t mp_pool_free(mp_pool_t *pool, void *ptr);
/* ptr is also used on s: it becomes reusable elsewhere only once the work
 * queued on s up to its free has completed. A movable block's pointer
 * (mp_handle_ptr) is accepted too. */
MP_API mp_status_t mp_pool_record_stream(mp_pool_t *pool, void *ptr,
                                         mp_stream_t s);
/* mp_pool_record_stream(pool, ptr, s) and mp_pool_free(pool, ptr) in one
 * step: ptr may still be in use by work queued on s (cudaFreeAsync). A
 * pointer it refuses leaves no use of s behind. */
MP_API mp_status_t mp_pool_free_async(mp_pool_t *pool, void *ptr,
                                      mp_stream_t s);
/* cuMemFree's meaning without its device synchronize: ptr may still be in
 * use by work queued on any stream the pool knows (streams it served,
 * those named by mp_pool_record_stream or mp_pool_add_stream, destroyed
 * ones whose work may still run); no stream reuses it before all of that
 * has completed. Up to MP_POOL_FREE_AFTER_ALL_STREAMS streams the block
 * waits for their marker events; beyond, for the pool's next device
 * synchronize (trim, defragment, the out-of-memory ladder). */
MP_API mp_status_t mp_pool_free_after_all(mp_pool_t *pool, void *ptr);
#define MP_POOL_FREE_AFTER_ALL_STREAMS 4
/* Makes s known to the pool without allocating on it, so that
 * mp_pool_free_after_all waits for its work (the LD_PRELOAD shim adds
 * every stream the program creates). A handle the device can tell is not
 * one of its streams: MP_EINVAL. */
MP_API mp_status_t mp_pool_add_stream(mp_pool_t *pool, mp_stream_t s);
/* One block split into count adjacent pieces, each freeable on its own and
 * each aligned (sizes are rounded up to the alignment). count 0, a NULL
 * array or a 0 size is MP_EINVAL. */
MP_API mp_status_t mp_pool_alloc_contiguous(mp_pool_t *pool, size_t count,
                                            const size_t *sizes, mp_stream_t s,
                                            void **out /* count pointers */);
/* Gives cached memory back to the device, after synchronizing the streams
 * that used it, until at most keep_bytes of free memory remain reserved.
 * Where the device refuses to take a piece back, that piece stays the
 * pool's, free (the next trim tries it again), the other pieces are still
 * given back, and the trim returns the device's status (the message says
 * how many pieces were refused and how much stays free), as PyTorch's
 * emptyCache raises when a cudaFree fails. */
MP_API mp_status_t mp_pool_trim(mp_pool_t *pool, size_t keep_bytes);

/* Child pools: a fixed range carved out of the parent; it never grows.
 * A child ignores max_split (its range is one block it must split).
 * Its reserved_bytes is its range; the parent counts the range as allocated.
 * The range is the block the parent hands out for bytes, which may be a
 * little larger (rounded to the alignment, and a rest too small to split
 * off stays in it: 20 MiB - 600 KiB gave 20 MiB on the host device); the
 * child may use all of it.
 * With history=N (the parent's config, as every setting but the cap and
 * max_split) the child's trace starts with a segment_alloc of its range,
 * and the parent's allocates the range at create and frees it at the
 * child's destroy. */
MP_API mp_status_t mp_pool_create_child(mp_pool_t *parent, size_t bytes,
                                        mp_pool_t **out);

/* Graph-private pools (CUDA graphs: PyTorch's graph_pool_handle and
 * MemPool, cudaMallocAsync's graph memory nodes). Memory that a captured
 * graph uses must keep its address across replays and go to no one else
 * while the graph lives. A graph pool is a pool of its own (mp_pool_alloc,
 * mp_pool_free, mp_pool_stats and mp_pool_check work on it) that grows by
 * borrowing ranges of its parent (each counted as allocated there, like a
 * child pool's range) and never gives them back before
 * mp_pool_graph_release; its reserved_bytes is what the graph pins. It has
 * no cap of its own: its ranges count against the parent's cap as it is
 * when each is borrowed (mp_pool_set_max_fraction on the parent included),
 * and a refusal is the parent's MP_ELIMIT or MP_ENOMEM.
 *
 * Capture rules: while a stream allocates to a graph pool (between
 * mp_pool_graph_begin and mp_pool_graph_end), neither pool records an
 * event on it, queries it, or synchronizes: CUDA forbids waiting on a
 * capturing stream and querying events captured on it, and in global mode
 * a device synchronize by any thread. So a block freed on that stream is
 * reusable at once on the same stream (later captured work runs after the
 * free), by another stream only after the capture ended (a graph pool
 * borrows from its parent only memory no work queued so far uses, on any
 * stream, the capturing one included: a graph launched on another stream
 * runs after nothing queued before its capture); and an
 * out-of-memory ladder in either pool makes no synchronize: in its place
 * it waits, on the host, for an event on each stream not captured and for
 * the last point the pool marked on each captured stream before its
 * capture began (the device waits for it on a stream of the pool's own),
 * so that memory only that work held serves the allocation instead of an
 * out-of-memory answer; what the capture freed stays the graph's
 * (mp_pool_trim of the parent is MP_EBUSY meanwhile where it has memory to
 * give back and would have to wait for work queued on the captured stream,
 * or synchronize the device, first; with nothing above keep_bytes to give
 * back it is MP_OK; a graph pool's trim gives nothing back before its
 * release). Growth during capture is memory
 * taken from the device in the calling thread's relaxed capture mode (the
 * cuda backend swaps it around every allocation and mapping, as PyTorch's
 * cudaMallocMaybeCapturing does), not memory reserved ahead: no graph
 * pool reserves anything before its first allocation. */

/* A new, empty graph pool drawing from parent (a pool that is neither a
 * child nor a graph pool: else MP_EINVAL). The parent counts it as a child:
 * mp_pool_destroy(parent) is MP_EBUSY until it is released. A graph pool
 * has no child pools and no movable blocks (mp_pool_create_child and
 * mp_pool_alloc_movable on it: MP_EINVAL). */
MP_API mp_status_t mp_pool_graph_create(mp_pool_t *parent, mp_pool_t **out);
/* From now on mp_pool_alloc(parent, bytes, s, ...) is served by graph, and
 * s is capturing for both pools (the rules above). Call it before
 * cuStreamBeginCapture on s (or right after, before any allocation on s);
 * call it again for other streams that join the capture (a fork through
 * events), or for later captures sharing graph (PyTorch's pool=). Frees
 * and mp_pool_record_stream through parent of graph memory are passed to
 * graph wherever they come from. s already routed: MP_EBUSY; graph not a
 * graph pool of parent, or released: MP_EINVAL. s the legacy default
 * stream (NULL, or CU_STREAM_LEGACY), which CUDA never captures (cuda.h,
 * cuStreamBeginCapture: "Capture may not be initiated if stream is
 * CU_STREAM_LEGACY"): MP_EINVAL, nothing changed, on every device, the
 * host one included. CU_STREAM_PER_THREAD can be captured and is routed. */
MP_API mp_status_t mp_pool_graph_begin(mp_pool_t *parent, mp_pool_t *graph,
                                       mp_stream_t s);
/* Stops routing s (after cuStreamEndCapture): allocations on s come from
 * parent again, and both pools may again record and query on s. Blocks
 * freed during the capture become reusable by graph's other streams once
 * their work passed. s not routed: MP_EINVAL. A stream destroyed (or
 * forgotten, mp_stream_forget) before its end stops being routed then.
 * For CU_STREAM_PER_THREAD, begin, end and mp_pool_graph_of name the
 * calling thread's own stream. */
MP_API mp_status_t mp_pool_graph_end(mp_pool_t *parent, mp_stream_t s);
/* The graph pool s allocates to, or NULL. */
MP_API mp_pool_t *mp_pool_graph_of(mp_pool_t *parent, mp_stream_t s);
/* The graph is gone (its last executable destroyed): graph's memory goes
 * back to its parent as free blocks, reusable there once the work queued
 * on every stream the parent or the graph pool knows has passed
 * (mp_pool_free_after_all; the parent learns the graph pool's streams
 * first, or waits for a device synchronize where it cannot; a replay on a
 * stream neither pool saw must be complete). Blocks still
 * live (a graph's outputs) keep the pool until their last free, which
 * returns everything (a free from inside an allocation on graph, such as
 * its out-of-memory handler's, leaves that to the allocation, which does it
 * before it returns); meanwhile mp_pool_alloc and mp_pool_alloc_contiguous
 * on graph are MP_EINVAL (no new block for a graph that is gone). graph is
 * invalid after the last block goes; it is MP_EBUSY (nothing done) while a
 * stream still allocates to it, MP_EINVAL when it is no graph pool or released
 * already. mp_pool_destroy of a graph pool does the same. */
MP_API mp_status_t mp_pool_graph_release(mp_pool_t *graph);

/* Model memory: compact what is live now to the bottom and freeze it there.
 * Returns when its copies are complete. Every block live at the call is
 * fenced: defragmentation never moves it again and works only above the
 * fence of each segment (the top of its highest block live at the freeze).
 * Frozen blocks may still be freed; allocations may then reuse their
 * space, defragmentation does not (the fence stays where it was). */
MP_API mp_status_t mp_pool_freeze(mp_pool_t *pool);

/* Movable blocks and defragmentation. A movable block is allocated like
 * any other (0 bytes: MP_OK with *out = NULL) but reached through its
 * handle, so defragmentation may move it. */
typedef struct mp_handle mp_handle_t;
MP_API mp_status_t mp_pool_alloc_movable(mp_pool_t *pool, size_t bytes,
                                         mp_stream_t s, mp_handle_t **out);
/* NULL for a stale handle (its block freed, or its pool destroyed).
 * Valid until the next defragmentation, including one that the
 * out-of-memory ladder runs inside an allocation from this pool
 * (MP_POOL_DEFRAG_ON_OOM; its copies are ordered on the allocating
 * stream). Read it again after anything that may defragment. */
MP_API void *mp_handle_ptr(const mp_handle_t *h);
/* Stream-ordered like mp_pool_free; NULL: MP_OK. A stale handle (freed
 * already, however often its slot was reused since): MP_EINVAL, nothing
 * freed. mp_pool_free of a movable block's pointer: MP_EINVAL. */
MP_API mp_status_t mp_handle_free(mp_handle_t *h);
/* Copies are ordered on s: work queued on s afterwards sees the moved data;
 * synchronize s before touching it from the host or another stream. Work
 * queued earlier on every stream the pool knows is waited for, by an event
 * on each, when something is to move: the streams its blocks were
 * allocated, freed or recorded on (mp_pool_record_stream names another
 * stream that uses a movable block; no device synchronize, which CUDA
 * forbids while another thread captures a graph in global mode). Movable blocks
 * slide down over the free space below them inside their segment (raw-pointer
 * blocks never move), and plain segments holding only movable blocks are
 * emptied into free space elsewhere, so the freed space coalesces and
 * mp_pool_trim can return it. */
MP_API mp_status_t mp_pool_defragment(mp_pool_t *pool, mp_stream_t s,
                                      size_t *moved_bytes /* may be NULL */);

/* Pause and resume (an RLHF trainer and an inference engine taking turns
 * on one GPU). Pause waits for the streams that used the pool (an event
 * on each, no device synchronize), then gives every mapped byte
 * back to the device while keeping the pool's virtual addresses reserved
 * (with MP_PAUSE_KEEP_CONTENT, the live blocks are first copied to one
 * page-locked host buffer). Afterwards reserved_bytes and free_bytes are 0
 * (reserved_bytes: the bytes still mapped, when a failed undo left some);
 * every call on the pool but resume, stats (mp_pool_reset_peaks too: the
 * peaks start again from the paused pool's values), mp_pool_mem_info (the cap
 * and what is free under it), dump, snapshot, destroy, mp_handle_ptr, calls
 * that do nothing (an allocation of 0 bytes, a free of NULL: MP_OK), and
 * the settings mp_pool_set_access and mp_pool_set_oom_handler (kept for
 * after the resume) is MP_EBUSY,
 * mp_pool_set_max_fraction included (a snapshot of a paused pool lists no
 * segment, and mp_pool_dump's segment says it holds 0 bytes, marked
 * paused, with the blocks the resume brings back; with history=N its trace
 * has a segment_unmap per chunk the pause gave back, after a free
 * (free_requested, free_completed) of each live block there, and a
 * segment_map per chunk resume maps again, before an alloc of each live
 * block there: memory_viz allows no live block in unmapped memory; where a
 * failed undo left chunks mapped, those
 * are what the snapshot and dump show and reserved_bytes counts). A pool that
 * holds plain segments (no virtual memory, or virtual=0), is a child or a
 * graph pool: MP_ENOTSUP. A pool on its virtual range holds plain segments only
 * where it took one near its cap: when the cap (max_bytes, max_fraction) is no
 * whole number of granules (2 MiB), the last request that fits under it but
 * whose whole granules do not gets a plain segment of its own size. The pause
 * gives such a segment back with the rest when it holds no block in use (resume
 * does not bring it back); a block in use in one is MP_ENOTSUP, the message
 * saying how many and what to do: free them, or use a cap that is a whole
 * number of granules, or create the pool with pausable=1 (MP_POOL_PAUSABLE: it
 * never takes a plain segment, and such a request is MP_ELIMIT instead). A
 * mapping that a peer's refused access left behind (mp_pool_set_access: the
 * device refused the access and then its unmap) is unmapped first; refused
 * again, the pause fails (the driver's status), the pool running as it was.
 * Live child pools or a pool paused already: MP_EBUSY. A pause that fails
 * leaves the pool as it was (but for free plain segments it gave back), unless
 * mapping back what it had unmapped fails too (a second device failure): then
 * the pool stays paused (the message says so, the host copy kept) and
 * mp_pool_resume maps the rest. One pool per tag (weights, KV cache) pauses
 * each separately.
 */
#define MP_PAUSE_KEEP_CONTENT 0x1u
MP_API mp_status_t mp_pool_pause(mp_pool_t *pool, unsigned flags);
/* Maps the memory again at the same addresses, content back if it was kept
 * (byte for byte); without it the content is undefined. What the pool held
 * before the pause comes back even above a cap lowered since (by
 * mp_pool_set_max_fraction before the pause): that is no growth, and it
 * stays until trimmed, as it would have without the pause. On failure (the
 * device has no room: another tenant still holds it) nothing is lost: the
 * pool is still paused, its host copy kept, and resume may be tried again
 * (one whose undo could not unmap every chunk again maps only the others).
 * Not paused: MP_EINVAL. */
MP_API mp_status_t mp_pool_resume(mp_pool_t *pool);

/* IPC: a pool block shared with another process (an inference engine's
 * KV cache read by a separate server, a trainer's weights by an engine).
 *
 * The exporter calls mp_pool_ipc_export on a live block and sends the
 * handle (mp_ipc_send over a Unix socket: the handle's bytes plus its
 * descriptors by SCM_RIGHTS); the importer receives it (mp_ipc_recv),
 * maps it with mp_ipc_import on a device of the same kind, uses the
 * pointer, and unmaps it with mp_ipc_close. What travels:
 *  - virtual-memory blocks (the default pool on CUDA and on the host
 *    device): the physical allocation (one mapped chunk) as a POSIX file
 *    descriptor (cuMemExportToShareableHandle; the importer reserves an
 *    address range and maps it, cuMemImportFromShareableHandle + cuMemMap);
 *  - plain segments on CUDA: a CUipcMemHandle (cuIpcGetMemHandle of the
 *    segment; cuIpcOpenMemHandle in the importer);
 *  in both cases with the block's offset inside that memory. The importer
 *  can reach the rest of the exported allocation too (as with CUDA's own
 *  IPC); only the block is the caller's.
 *
 * The release rule: every export makes a lease, a socket pair whose
 * importer end travels in the handle (lease_fd) and is kept open by the
 * import until mp_ipc_close (or until the importing process exits). A
 * block freed by its owner (mp_pool_free and the other frees) while a
 * lease of it is still open is held: it stays allocated (its bytes count
 * in allocated_bytes), a second free of it is MP_EINVAL, and it is not
 * reused until every importer has let go; the pool checks its leases
 * (one poll each, never waiting) at allocations while it holds blocks, at
 * export, trim, pause and mp_pool_ipc_poll. A lease that never reaches an
 * importer must be closed by the exporter (mp_ipc_handle_close), or the
 * block stays held until the pool is destroyed. mp_pool_pause refuses
 * (MP_EBUSY) while any lease is open: the memory would not go back to the
 * device. mp_pool_destroy polls the leases too, and refuses (MP_EBUSY,
 * nothing else changed: freed blocks whose importers all let go are
 * released, as any poll releases them) while a block of a plain segment is
 * still imported:
 * cuMemFree of the segment before the importer's cuIpcCloseMemHandle is
 * undefined (cuda.h, cuIpcOpenMemHandle). Otherwise it closes the leases
 * left, and what importers still map of virtual chunks stays valid on their
 * side (each import holds its own reference to the physical memory, which
 * goes only when every mapping and reference is released: cuda.h,
 * cuMemRelease; the host device keeps exported pages).
 *
 * Limits: a block must lie in one device allocation (a virtual block that
 * spans two mapped chunks, or a block of a child pool: MP_ENOTSUP);
 * movable blocks (mp_pool_alloc_movable) are MP_EINVAL (they move). The
 * importer's device must be of the exporter's kind ("host" with "host",
 * "cuda" with "cuda"). */
#define MP_IPC_FD   1u /* fd: a descriptor of the exported memory */
#define MP_IPC_CUDA 2u /* opaque: a CUipcMemHandle (plain CUDA segments) */
typedef struct mp_ipc_handle {
  unsigned kind;            /* MP_IPC_FD or MP_IPC_CUDA; 0: empty */
  int fd;                   /* MP_IPC_FD: the memory; -1 otherwise */
  int lease_fd;             /* the importer's end of the lease; -1: none */
  size_t mem_bytes;         /* size of the exported device allocation */
  size_t offset;            /* the block's offset inside it */
  size_t bytes;             /* the block's size (rounded, as allocated) */
  unsigned char opaque[64]; /* MP_IPC_CUDA: the CUipcMemHandle; MP_IPC_FD
                               of a host device: the export's tag, which
                               an import checks its descriptor holds (a
                               number closed and reused: MP_EINVAL); of a
                               cuda device: the export's own number, which
                               its lease's stamp names */
  char backend[16];         /* the exporting device's kind: "host", "cuda" */
} mp_ipc_handle_t;

/* Exports the live block that starts at ptr. On MP_OK *out holds new
 * descriptors (the memory's, for MP_IPC_FD, and the lease's) owned by the
 * caller: send them, then close them with mp_ipc_handle_close. A block may
 * be exported any number of times (a lease each). NULL arguments, a
 * pointer that is not the start of a live block of this pool, a movable
 * block: MP_EINVAL; paused: MP_EBUSY; see Limits for MP_ENOTSUP. A failed
 * export leaves *out untouched and changes nothing but what its poll of
 * the leases did (freed blocks whose importers all let go are released). */
MP_API mp_status_t mp_pool_ipc_export(mp_pool_t *pool, void *ptr,
                                      mp_ipc_handle_t *out);
/* Releases every held block whose importers have all let go (one poll per
 * lease, never waiting) and says how many blocks are still held (held may
 * be NULL). Paused: MP_EBUSY (held untouched). */
MP_API mp_status_t mp_pool_ipc_poll(mp_pool_t *pool, size_t *held);
/* Maps the memory h names into this process through dev and sets *out to
 * the block (its first byte). On MP_OK the import owns h's descriptors (h
 * keeps its sizes, its fd and lease_fd become -1); keep the import until
 * mp_ipc_close, which tells the exporter the block is free to reuse. A
 * handle that is empty, of another device kind, of an unknown kind,
 * without its descriptors, whose lease an open import owns (a copy of a
 * handle imported already, on any device of the process: import a handle
 * once; another device needs a handle of its own), or whose block does not
 * lie inside its memory (on the host device, inside the allocation that
 * was exported, whatever the handle's sizes and its descriptor's offset
 * claim): MP_EINVAL, and h is left as it was (its descriptors still
 * open). So is a handle whose lease is not its own export's: every lease
 * carries a stamp of the block and memory its export named, and a stale
 * copy of a handle (kept after its import closed or after
 * mp_ipc_handle_close, its descriptor numbers given out again since) whose
 * lease number now names another export's lease does not match it:
 * MP_EINVAL, nothing changed. Where the device had mapped the memory
 * before such a refusal and then refuses to unmap it, the mapping stays in
 * the process until mp_device_close unmaps it (as it unmaps the imports
 * left open): the unmap's status, and the message names the refusal and
 * what stays mapped. */
MP_API mp_status_t mp_ipc_import(mp_device_t *dev, mp_ipc_handle_t *h,
                                 void **out);
/* Unmaps an import (ptr as mp_ipc_import gave it) after the device's
 * queued work, and closes its lease. Anything else: MP_EINVAL. A close the
 * device fails (a call from a host function, a driver error) changes
 * nothing: the import stays mapped and leased and may be closed again;
 * only when the device had unmapped the memory before failing is the
 * import closed anyway (the message says so). Imports left open are
 * closed by mp_device_close. The wait is a device synchronization, which
 * CUDA refuses while another thread captures a graph in global mode (the
 * capture is invalidated, whatever this thread's capture mode): where
 * that may happen, use mp_ipc_close_after. */
MP_API mp_status_t mp_ipc_close(mp_device_t *dev, void *ptr);
/* mp_ipc_close after the work queued on s so far instead of the device's
 * (a stream synchronization, which leaves other threads' captures alone):
 * the caller vouches that s covers every use of the import (it was used on
 * s only, or s waits on events of the other streams that used it), as
 * PyTorch's consumer of shared CUDA memory synchronizes its current
 * stream. s: NULL (the default stream) or a live stream of dev, else
 * MP_EINVAL; a stream being captured into a graph: MP_EBUSY (its work runs
 * when the graph is launched), and so is NULL while a blocking stream of
 * the device captures, in any capture mode (CUDA refuses a wait for the
 * legacy stream then, and invalidates that capture). Otherwise as
 * mp_ipc_close. */
MP_API mp_status_t mp_ipc_close_after(mp_device_t *dev, void *ptr,
                                      mp_stream_t s);
/* Sends h over the connected Unix socket sock: its bytes in one message
 * with its open descriptors attached (SCM_RIGHTS). h is not changed: its
 * descriptors are still the sender's to close. A bad socket: MP_EIO; an
 * empty handle, one of an unknown kind, or one without its descriptors
 * (imported already: the import took them): MP_EINVAL, nothing sent. */
MP_API mp_status_t mp_ipc_send(int sock, const mp_ipc_handle_t *h);
/* Receives what mp_ipc_send sent into *out, with descriptors of this
 * process (close-on-exec). The peer gone before a whole handle came, or a
 * message that is not one: MP_EIO, with nothing received left open. */
MP_API mp_status_t mp_ipc_recv(int sock, mp_ipc_handle_t *out);
/* Closes the descriptors h still holds and empties it (kind 0, -1s). An
 * empty handle (kind 0, a zeroed struct too) holds none: MP_OK, nothing
 * closed. A copy of a handle imported already in this process, or being
 * imported on another thread (its lease is the import's; mp_ipc_close
 * ends the import), or a handle of an unknown kind: MP_EINVAL, nothing
 * closed. */
MP_API mp_status_t mp_ipc_handle_close(mp_ipc_handle_t *h);

/* Out-of-memory handler, for engines that react to running out (free a
 * cache, dump a snapshot, log): called when mp_pool_alloc,
 * mp_pool_alloc_movable, mp_pool_alloc_contiguous (bytes: the pieces'
 * rounded sum) or mp_pool_create_child is about to fail with MP_ENOMEM or
 * MP_ELIMIT for want of device memory (not host memory), with or without
 * arenas, after the pool's own ladder (a graph pool's range the pool
 * cannot lend asks the pool's handler, once per allocation of the graph
 * pool), on the allocating thread with the pool unlocked (it may free,
 * trim, dump or allocate from the pool; mp_last_error() says what
 * failed). A nonzero return tries the allocation once more (what it
 * answers is what the allocation counts in oom_count: nothing once
 * served); zero lets it fail. While a handler runs, no handler is called
 * again on its thread: an allocation it makes (from any pool) that runs
 * out fails at once, so a handler that allocates and always answers
 * nonzero cannot recurse without end. fn NULL removes the handler. */
typedef int (*mp_pool_oom_handler_t)(mp_pool_t *pool, size_t bytes,
                                     mp_status_t status, void *ctx);
MP_API mp_status_t mp_pool_set_oom_handler(mp_pool_t *pool,
                                           mp_pool_oom_handler_t fn, void *ctx);

/* Writes the pool's state as the dictionary PyTorch's
 * torch.cuda.memory._snapshot() returns, pickled (protocol 2), so that
 * torch/cuda/_memory_viz.py, the memory_viz page and `mpbench replay` read
 * it: "segments" (mapped runs of the virtual range and plain segments, with
 * their blocks, each with "device": the ordinal of the pool's device, N for
 * cuda:N, 0 for host) and "device_traces" (one list per ordinal up to the
 * pool's, the lists of the lower ordinals empty: the history ring, oldest
 * first, the rings of a pool's arenas merged by time; empty without
 * history=N). Trace actions: alloc, free_requested and
 * free_completed (both at mp_pool_free: the block is reusable at once on
 * its own stream; other streams wait for its markers, which the history
 * does not record, nor the end of the work of streams it was used on,
 * which the snapshot's state shows as active_pending_free; a block freed while
 * another process imports it, the free_requested at the free, the
 * free_completed when its leases close), segment_map / segment_unmap (virtual
 * chunks), segment_alloc / segment_free (plain segments, a child pool's range,
 * a graph pool's borrowed ranges) and oom. An alloc's and a free's size is the
 * bytes asked for (the block's requested_size), as PyTorch records them (its
 * alloc event takes the request, before rounding); a segment event's, the
 * segment's or chunk's. A segment's segment_pool_id is (0, 0), or for a graph
 * pool (0, n), n an id of its own (as PyTorch gives a private pool's segments
 * its id; the graph pool of a PyTorch MempoolId_t, mempool/torch.h, says that
 * id); the parent's snapshot shows the ranges it lent as live blocks. A
 * segment's segment_type is "small" for a plain segment made for a request of
 * at most segment_bytes/2 (the one such requests share, as PyTorch's small pool
 * packs requests up to 1 MiB into 2 MiB segments), else "large" (the virtual
 * range's runs too); unlike PyTorch's, a small segment may later hold a larger
 * block (one free index serves every size). A block's state is PyTorch's:
 * "active_allocated" while the program holds it, "active_pending_free"
 * while it is no caller's but not yet reusable (freed while imported,
 * held by the out-of-memory ladder while it waits for the streams, or free
 * but waiting, as far as the pool knows without asking the device, for
 * work on two streams or more or for a device sync, so that no stream
 * could take it without waiting), "inactive" when free otherwise; a segment's
 * allocated_size sums the first, active_size and requested_size the first two
 * (so allocated_size leaves out pending blocks that the stats' allocated_bytes
 * counts). The file is written whole or not at all (a temporary beside it,
 * renamed); a symbolic link to a regular file stays a link, the file it names
 * replaced so; a path that is there and is no regular file (a device, a FIFO, a
 * link to one) is written in place, never replaced. A NULL or unwritable path
 * is MP_EINVAL / MP_EIO with a message. A pool with arenas: the segments of
 * every arena made so far, on the pool's device. */
MP_API mp_status_t mp_pool_snapshot(mp_pool_t *pool, const char *path);
/* The same pickle written to an open stream (not closed). */
MP_API mp_status_t mp_pool_snapshot_file(mp_pool_t *pool, FILE *out);

/* Walks every invariant: MP_OK or MP_ECORRUPT (mp_last_error() says which);
 * MP_EBUSY from a host function while another thread's device call on the
 * pool is under way (see the top). */
MP_API mp_status_t mp_pool_check(mp_pool_t *pool);

/* The device a pool draws from. */
MP_API mp_device_t *mp_pool_device(const mp_pool_t *pool);

#ifdef __cplusplus
}
#endif
#endif /* MEMPOOL_POOL_H */
