/* mpbench.c - the mpbench executable: everything is in mpbench_core
 * (bench/core/), so that the tests drive the same code. */
#include "core/mpbench.h"

int main(int argc, char **argv) {
  return mpb_main(argc, argv);
}
