/* tsan_criterion.c - lets Criterion start under ThreadSanitizer.
 *
 * Criterion's sandbox (BoxFort) maps its shared arena with MAP_FIXED at
 * 0x2000_0000_0000 + (rand_r() & 0x3fffff) * 16 MiB, retrying a few times
 * when a probe finds the place in use. ThreadSanitizer lets an application
 * map only a few windows of that range (about 2% of it on x86_64), so
 * Criterion nearly always aborts with "Could not initialize inheritable
 * arena" (Snaipe/Criterion#274). Linked into the test executables of TSan
 * builds only, this rand_r() returns the first pseudo-random value whose
 * arena address the sanitizer would let the application map; the values
 * are otherwise an ordinary linear congruential sequence. Nothing else in
 * the tests or the library calls rand_r(). */
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>

int rand_r(unsigned *seed);

/* Would an anonymous mapping at addr be placed there? The sanitizer moves a
 * hint it refuses; the kernel moves one that is in use. */
static bool app_may_map(uintptr_t addr) {
  void *want = (void *)addr;
  void *p = mmap(want, 4096, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p != MAP_FAILED)
    munmap(p, 4096);
  return p == want;
}

int rand_r(unsigned *seed) {
  unsigned first = 0;
  for (int i = 0; i < 1 << 16; i++) {
    *seed = *seed * 1103515245u + 12345u;
    unsigned v = (*seed >> 1) & 0x7fffffffu;
    if (i == 0)
      first = v;
    if (app_may_map((uintptr_t)0x200000000000 +
                    ((uintptr_t)(v & 0x3fffff) << 24)))
      return (int)v;
  }
  return (int)first;
}
