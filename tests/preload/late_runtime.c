/* late_runtime.c - a stand-in for a CUDA runtime that a process loads after
 * its first driver call (a Python process that pins memory through a
 * driver-API library, then imports one on the runtime): its cudaMalloc
 * hands out a buffer of its own and says so, so that a test can tell
 * that the call reached it. */
#include <stddef.h>

static char late_buffer[64];

unsigned int cudaMalloc(void **p, size_t bytes);
unsigned int cudaMalloc(void **p, size_t bytes) {
  if (p == NULL || bytes > sizeof late_buffer)
    return 1u; /* cudaErrorInvalidValue */
  *p = late_buffer;
  return 0u;
}
