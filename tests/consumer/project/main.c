/* A program outside the tree that uses the installed mempool: it must find
 * the headers and the library and do real work on the host device. */
#include <mempool/mempool.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  mp_device_t *dev = NULL;
  mp_status_t st = mp_device_open("host:capacity=64M", &dev);
  if (st != MP_OK) {
    fprintf(stderr, "open: %s: %s\n", mp_status_string(st), mp_last_error());
    return 1;
  }
  void *p = NULL;
  st = mp_device_alloc(dev, 1 << 20, &p);
  if (st == MP_OK) {
    st = mp_memset_async(dev, p, 0x5a, 1 << 20, NULL);
    if (st == MP_OK)
      st = mp_stream_synchronize(dev, NULL);
    if (st == MP_OK && ((unsigned char *)p)[(1 << 20) - 1] != 0x5a)
      st = MP_ECORRUPT;
    mp_status_t fs = mp_device_free(dev, p);
    if (st == MP_OK)
      st = fs;
  }
  mp_device_close(dev);
  if (st != MP_OK) {
    fprintf(stderr, "consumer: %s: %s\n", mp_status_name(st), mp_last_error());
    return 1;
  }
  printf("consumer: ok (%s)\n", MEMPOOL_VERSION_MAJOR == 0 ? "0.x" : "n.x");
  return 0;
}
