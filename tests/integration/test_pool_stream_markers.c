/* Frees on a stream that is behind the host, in a pool used from two
 * streams, on the host device (the scenario: support/stream_markers.h; its
 * strict-fake-driver / GPU twin, which also counts the markers, is in
 * fakecuda/test_cuda_pool_rules.c): what the freeing stream has not done
 * never goes to the other stream, the frees left in an open epoch no more
 * than the first, and all of it does once the stream is done. */
#include <criterion/criterion.h>

#include <mempool/mempool.h>

#include "../support/gated_streams_fixture.h"
#include "../support/stream_markers.h"

TestSuite(pool_stream_markers, .init = setup, .fini = teardown);

Test(pool_stream_markers,
     frees_on_a_busy_stream_stay_with_it_and_serve_another_once_done) {
  markers_frees_on_a_busy_stream(pool, dev, &gate, s1, s2, NULL);
}

/* Frees finished before a capture serve another stream during it (the
 * host device has no capture: mp_pool_graph_begin marks s1 capturing). */
Test(pool_stream_markers,
     frees_finished_before_a_capture_serve_another_stream) {
  markers_frees_before_a_capture(pool, dev, s1, s2, NULL);
}
