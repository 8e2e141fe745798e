/* fuzz_conf - libFuzzer harness for the option parsers: pool options
 * (mp_pool_config_parse) and host device specs (mp_device_open("host:...")).
 * A refused string leaves the config exactly as it was and says why; an
 * accepted one gives a config that mp_pool_create either takes or refuses
 * with a message, and a device that opens and closes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

#include "fuzz_require.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  if (size > 512)
    size = 512; /* option strings are short; longer adds nothing */
  char opts[520];
  memcpy(opts, data, size);
  opts[size] = '\0';
  if (data[0] & 1) {
    mp_pool_config_t cfg, before;
    mp_pool_config_init(&cfg);
    before = cfg;
    mp_status_t st = mp_pool_config_parse(&cfg, opts + 1);
    if (st != MP_OK) {
      FZ_REQUIRE(st == MP_EINVAL);
      FZ_REQUIRE(memcmp(&cfg, &before, sizeof cfg) == 0);
      FZ_REQUIRE(mp_last_error()[0] != '\0');
    }
  } else {
    char spec[540];
    /* Small capacities only: a fuzzer must not reserve terabytes. */
    snprintf(spec, sizeof spec, "host:%s", opts + 1);
    mp_device_t *dev = NULL;
    mp_status_t st = mp_device_open(spec, &dev);
    if (st == MP_OK) {
      size_t f = 0, t = 0;
      FZ_REQUIRE(mp_device_mem_info(dev, &f, &t) == MP_OK && f <= t);
      mp_device_close(dev);
    } else {
      FZ_REQUIRE(dev == NULL);
      FZ_REQUIRE(mp_last_error()[0] != '\0');
    }
  }
  return 0;
}
