/* replay_main - runs the fuzz harness on a fixed number of pseudo-random
 * inputs, so that the harness runs everywhere (ctest) without libFuzzer.
 *   fuzz_pool_replay [inputs=300] [first seed=1]   (fuzz_snapshot_replay too)
 * (ctest runs 150: every operation is followed by a full mp_pool_check, so
 * that is already ~150 000 checked operations.) */
#include "../../bench/core/xorshift.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
  unsigned long inputs = argc > 1 ? strtoul(argv[1], NULL, 10) : 300;
  unsigned long first = argc > 2 ? strtoul(argv[2], NULL, 10) : 1;
  static uint8_t buf[8192];
  for (unsigned long seed = first; seed < first + inputs; seed++) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1;
    size_t len = 1 + (size_t)(x % sizeof buf);
    for (size_t i = 0; i < len; i++) {
      xorshift64(&x);
      buf[i] = (uint8_t)(x >> 24);
    }
    LLVMFuzzerTestOneInput(buf, len);
  }
  printf("%s: %lu inputs from seed %lu passed\n", argv[0], inputs, first);
  return 0;
}
