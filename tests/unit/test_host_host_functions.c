/* A host function may not call into a host device at all, as CUDA says of
 * every API call (cuda.h, cuLaunchHostFunc: "The host function must not
 * make any CUDA API calls"): not only the calls that would wait for the
 * function's own stream (those hung), but allocations, frees, copies,
 * events and virtual memory too, which the host device used to serve
 * where a GPU's driver answers CUDA_ERROR_NOT_PERMITTED. Each refusal is
 * MP_EINVAL with a message, and changes nothing. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"

#include "../support/device_helpers.h"
#include "../support/dump_json.h"

#define MiB ((size_t)1 << 20)

/* What a host function got from each call it made into a device. */
typedef struct calls {
  mp_device_t *dev;  /* the device the function runs on */
  mp_device_t *peer; /* another host device */
  void *mem;         /* a live allocation of dev */
  mp_event_t ev;     /* a live event of dev */
  mp_status_t mem_info, alloc, free, host_alloc, stream_create, query, launch,
      copy, set, ev_create, ev_record, ev_query, ev_destroy, wait, reserve,
      peer_alloc, destroy;
  mp_stream_t victim; /* a stream destroy_victim destroys */
  void *got;          /* what the refused alloc wrote, if anything */
  char why[256];
  char free_why[256]; /* the refused free's message */
} calls_t;

static void nothing(void *arg) {
  (void)arg;
}

static void call_everything(void *arg) {
  calls_t *c = arg;
  size_t f = 0, t = 0;
  c->mem_info = mp_device_mem_info(c->dev, &f, &t);
  c->alloc = mp_device_alloc(c->dev, MiB, &c->got);
  snprintf(c->why, sizeof c->why, "%s", mp_last_error());
  c->free = mp_device_free(c->dev, c->mem);
  snprintf(c->free_why, sizeof c->free_why, "%s", mp_last_error());
  void *h = NULL;
  c->host_alloc = mp_device_host_alloc(c->dev, 4096, &h);
  mp_stream_t s = NULL;
  c->stream_create = mp_stream_create(c->dev, &s);
  c->query = mp_stream_query(c->dev, NULL);
  c->launch = mp_stream_launch_host(c->dev, NULL, nothing, NULL);
  c->copy = mp_memcpy_async(c->dev, c->mem, (char *)c->mem + 4096, 4096, NULL);
  c->set = mp_memset_async(c->dev, c->mem, 1, 4096, NULL);
  mp_event_t e = NULL;
  c->ev_create = mp_event_create(c->dev, &e);
  c->ev_record = mp_event_record(c->dev, c->ev, NULL);
  c->ev_query = mp_event_query(c->dev, c->ev);
  c->wait = mp_stream_wait_event(c->dev, NULL, c->ev);
  c->ev_destroy = mp_event_destroy(c->dev, c->ev);
  void *r = NULL;
  c->reserve = mp__device_vm_reserve(c->dev, 2 * MiB, &r);
  void *p = NULL;
  c->peer_alloc = mp_device_alloc(c->peer, MiB, &p);
}

Test(host_host_functions, every_device_call_from_a_host_function_is_einval) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  calls_t c = {.dev = dev, .peer = open_dev("host:capacity=64M")};
  cr_assert_eq(mp_device_alloc(dev, MiB, &c.mem), MP_OK);
  memset(c.mem, 0x5a, MiB);
  cr_assert_eq(mp_event_create(dev, &c.ev), MP_OK);
  size_t before = free_bytes(dev);
  run_in_host_fn(dev, call_everything, &c);
  const struct {
    const char *name;
    mp_status_t st;
  } got[] = {
      {"mp_device_mem_info", c.mem_info},
      {"mp_device_alloc", c.alloc},
      {"mp_device_free", c.free},
      {"mp_device_host_alloc", c.host_alloc},
      {"mp_stream_create", c.stream_create},
      {"mp_stream_query", c.query},
      {"mp_stream_launch_host", c.launch},
      {"mp_memcpy_async", c.copy},
      {"mp_memset_async", c.set},
      {"mp_event_create", c.ev_create},
      {"mp_event_record", c.ev_record},
      {"mp_event_query", c.ev_query},
      {"mp_stream_wait_event", c.wait},
      {"mp_event_destroy", c.ev_destroy},
      {"vm_reserve", c.reserve},
      {"another device's mp_device_alloc", c.peer_alloc},
  };
  for (size_t i = 0; i < sizeof got / sizeof *got; i++)
    cr_expect_eq(got[i].st, MP_EINVAL, "%s from a host function: %s",
                 got[i].name, mp_status_name(got[i].st));
  cr_expect(strstr(c.why, "host function") != NULL, "%s", c.why);
  /* Named as the call made (it said mp_device_synchronize once the free
   * synchronized first). */
  cr_expect(strncmp(c.free_why, "mp_device_free: ", 16) == 0, "%s", c.free_why);
  cr_expect_null(c.got);
  /* Nothing changed: the memory, its bytes and the event are as they were. */
  cr_expect_eq(free_bytes(dev), before);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(((unsigned char *)c.mem)[0], 0x5a, "the refused memset ran");
  cr_expect_eq(mp_event_query(dev, c.ev), MP_OK);
  cr_expect_eq(mp_event_destroy(dev, c.ev), MP_OK);
  cr_expect_eq(mp_device_free(dev, c.mem), MP_OK);
  mp_device_close(c.peer);
  mp_device_close(dev);
}

static void destroy_victim(void *arg) {
  calls_t *c = arg;
  c->destroy = mp_stream_destroy(c->dev, c->victim);
}

/* The "destroyed" streams pool's dump counts. */
static unsigned destroyed_streams(mp_pool_t *pool) {
  char *buf = dump_of(pool, "json");
  const char *at = strstr(buf, "\"destroyed\":");
  cr_assert_not_null(at, "%s", buf);
  unsigned n = (unsigned)strtoul(at + strlen("\"destroyed\":"), NULL, 10);
  free(buf);
  return n;
}

/* mp_stream_destroy from a host function is refused before the pools
 * forget the stream: it made every pool retire its slot first (its dump
 * counted the live stream as destroyed), and only then was refused. */
Test(host_host_functions,
     a_refused_stream_destroy_leaves_the_pools_as_they_were) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_pool_t *pool;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  calls_t c = {.dev = dev};
  cr_assert_eq(mp_stream_create(dev, &c.victim), MP_OK);
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, MiB, c.victim, &p), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(destroyed_streams(pool), 0);
  run_in_host_fn(dev, destroy_victim, &c);
  cr_expect_eq(c.destroy, MP_EINVAL, "%s", mp_status_name(c.destroy));
  cr_expect_eq(mp_stream_query(dev, c.victim), MP_OK, "the stream lives");
  cr_expect_eq(destroyed_streams(pool), 0, "the pool forgot a live stream");
  cr_assert_eq(mp_stream_destroy(dev, c.victim), MP_OK, "%s", mp_last_error());
  cr_expect_eq(destroyed_streams(pool), 1);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* What open_and_close got from a host function: mp_device_open and
 * mp_device_close, each a driver call on the cuda backend, and a close of
 * the very device whose stream runs the function would stop (join) that
 * stream from its own thread. */
typedef struct open_close {
  mp_device_t *dev, *peer;
  mp_device_t *opened; /* what the refused open wrote, if anything */
  mp_status_t open, own_close;
  char open_why[256], close_why[256], own_close_why[256];
} open_close_t;

static void open_and_close(void *arg) {
  open_close_t *c = arg;
  c->open = mp_device_open("host:capacity=64M", &c->opened);
  snprintf(c->open_why, sizeof c->open_why, "%s", mp_last_error());
  mp_device_close(c->peer);
  snprintf(c->close_why, sizeof c->close_why, "%s", mp_last_error());
  c->own_close = mp_device_close_ex(c->dev);
  snprintf(c->own_close_why, sizeof c->own_close_why, "%s", mp_last_error());
}

Test(host_host_functions,
     a_device_open_or_close_from_a_host_function_is_refused, .timeout = 30) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  open_close_t c = {.dev = dev, .peer = open_dev("host:capacity=64M")};
  void *mem;
  cr_assert_eq(mp_device_alloc(c.peer, MiB, &mem), MP_OK);
  memset(mem, 0x5a, MiB);
  run_in_host_fn(dev, open_and_close, &c);
  cr_expect_eq(c.open, MP_EINVAL, "%s", mp_status_name(c.open));
  cr_expect_null(c.opened, "the refused open wrote a device");
  cr_expect(strncmp(c.open_why, "mp_device_open: ", 16) == 0 &&
                strstr(c.open_why, "host function") != NULL,
            "%s", c.open_why);
  cr_expect(strncmp(c.close_why, "mp_device_close: ", 17) == 0 &&
                strstr(c.close_why, "host function") != NULL,
            "%s", c.close_why);
  /* Its status: the message alone was the close above's already. */
  cr_expect_eq(c.own_close, MP_EINVAL, "%s", c.own_close_why);
  cr_expect(strncmp(c.own_close_why, "mp_device_close: ", 17) == 0, "%s",
            c.own_close_why);
  /* Nothing closed: both devices and the peer's memory still serve. */
  cr_expect_eq(((unsigned char *)mem)[MiB - 1], 0x5a);
  cr_expect_eq(mp_device_free(c.peer, mem), MP_OK, "%s", mp_last_error());
  void *p;
  cr_expect_eq(mp_device_alloc(dev, MiB, &p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_device_free(dev, p), MP_OK, "%s", mp_last_error());
  mp_device_close(c.peer);
  mp_device_close(dev);
}
