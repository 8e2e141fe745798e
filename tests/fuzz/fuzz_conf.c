/* fuzz_conf - libFuzzer harness for the option parsers: pool options
 * (mp_pool_config_parse), host device specs (mp_device_open("host:...")) and
 * cuda device specs (mp_device_open("cuda:..."), parsed before the driver is
 * looked for, so without one too). A refused string leaves the config
 * exactly as it was and says why; an accepted one gives a config that
 * mp_pool_create either takes or refuses with a message, and a device that
 * opens and closes. A cuda spec is refused as bad (MP_EINVAL) exactly when it
 * is not "cuda" or "cuda:N" with N a decimal index up to 1024; a good one
 * opens, or fails only for want of a driver or device. */
#include <mempool/mempool.h>

#include "fuzz_require.h"

/* Decimal digits (leading zeros too) worth at most 1024: what may follow
 * "cuda:" (the spec here always has the colon, and "cuda:" alone is a spec
 * cut short). */
static bool cuda_index_ok(const char *opts) {
  size_t n = strlen(opts);
  if (n == 0 || strspn(opts, "0123456789") != n)
    return false;
  unsigned long v = 0;
  for (size_t i = 0; i < n && v <= 1024; i++)
    v = v * 10 + (unsigned long)(opts[i] - '0');
  return v <= 1024;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  char buf[513];
  const char *opts = fz_cstr(data + 1, size - 1, buf, sizeof buf);
  if (data[0] % 3 == 0) {
    mp_pool_config_t cfg, before;
    mp_pool_config_init(&cfg);
    before = cfg;
    mp_status_t st = mp_pool_config_parse(&cfg, opts);
    if (st != MP_OK) {
      FZ_REQUIRE(st == MP_EINVAL);
      FZ_REQUIRE(memcmp(&cfg, &before, sizeof cfg) == 0);
      FZ_REQUIRE(mp_last_error()[0] != '\0');
    }
    return 0;
  }
  bool cuda = data[0] % 3 == 2;
  char spec[540];
  /* Small capacities only: a fuzzer must not reserve terabytes. */
  snprintf(spec, sizeof spec, "%s:%s", cuda ? "cuda" : "host", opts);
  mp_device_t *dev = NULL;
  mp_status_t st = mp_device_open(spec, &dev);
  if (st == MP_OK) {
    FZ_REQUIRE(!cuda || cuda_index_ok(opts));
    size_t f = 0, t = 0;
    FZ_REQUIRE(mp_device_mem_info(dev, &f, &t) == MP_OK && f <= t);
    mp_device_close(dev);
    return 0;
  }
  FZ_REQUIRE(dev == NULL);
  FZ_REQUIRE(mp_last_error()[0] != '\0');
  if (cuda) {
    FZ_REQUIRE((st == MP_EINVAL) == !cuda_index_ok(opts));
    FZ_REQUIRE(st == MP_EINVAL || st == MP_ENODEV || st == MP_EDRIVER);
  }
  return 0;
}
