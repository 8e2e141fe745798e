/* cuMemHostRegister looks at every page of the range it is given, as the
 * process maps it (cuda.h: it "Page-locks the memory range specified by p
 * and bytesize and maps it for the device(s)"): a page mapped nowhere or
 * without read access cannot be registered; a page the CPU may only read
 * needs CU_MEMHOSTREGISTER_READ_ONLY. The fake reads /proc/self/maps for
 * it, whole lines however long. */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda.h>

#include "fakecuda_test.h"

/* The driver calls, from the libcuda.so.1 on the library path (this test
 * does not link the fake: fakecuda_test.h). */
static struct {
  CUresult (*init)(unsigned int);
  CUresult (*retain)(CUcontext *, CUdevice);
  CUresult (*release)(CUdevice);
  CUresult (*push)(CUcontext);
  CUresult (*pop)(CUcontext *);
  CUresult (*sync)(void);
  CUresult (*attribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*reg)(void *, size_t, unsigned int);
  CUresult (*unreg)(void *);
} drv;

static CUcontext ctx;

/* Device 0's primary context, retained and made current. */
static void open_ctx(void) {
  /* Each entry point into its slot of drv (FK_LOAD, by address). */
  struct {
    const char *name;
    void *slot;
  } entry[] = {{"cuInit", &drv.init},
               {"cuDevicePrimaryCtxRetain", &drv.retain},
               {"cuDevicePrimaryCtxRelease_v2", &drv.release},
               {"cuCtxPushCurrent_v2", &drv.push},
               {"cuCtxPopCurrent_v2", &drv.pop},
               {"cuCtxSynchronize", &drv.sync},
               {"cuDeviceGetAttribute", &drv.attribute},
               {"cuMemHostRegister_v2", &drv.reg},
               {"cuMemHostUnregister", &drv.unreg}};
  for (size_t i = 0; i < sizeof entry / sizeof entry[0]; i++) {
    void *sym = fk_test_sym(entry[i].name);
    memcpy(entry[i].slot, &sym, sizeof sym);
  }
  cr_assert_eq(drv.init(0), CUDA_SUCCESS);
  cr_assert_eq(drv.retain(&ctx, 0), CUDA_SUCCESS);
  cr_assert_eq(drv.push(ctx), CUDA_SUCCESS);
}

static void close_ctx(void) {
  (void)drv.sync();
  (void)drv.pop(NULL);
  (void)drv.release(0);
}

TestSuite(fakecuda_host_register, .init = open_ctx, .fini = close_ctx);

/* Device 0's attribute a. */
static int attribute(CUdevice_attribute a) {
  int v = 0;
  cr_assert_eq(drv.attribute(&v, a, 0), CUDA_SUCCESS);
  return v;
}

/* A registration cuda.h says fails, with the code the fake gives (cuda.h
 * names none: CUDA_ERROR_INVALID_VALUE, the one it lists for a bad
 * argument); on a GPU any failure. Nothing is left registered. */
static void refused(void *p, size_t n, unsigned flags, const char *why) {
  CUresult r = drv.reg(p, n, flags);
  cr_assert_neq(r, CUDA_SUCCESS, "%s: registered", why);
  if (!fk_is_real())
    cr_assert_eq(r, CUDA_ERROR_INVALID_VALUE, "%s: %d", why, (int)r);
  cr_assert_eq(drv.unreg(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
               "%s: a failed registration registered the range", why);
}

/* Whether the page at p is mapped nowhere (msync(2): ENOMEM). */
static bool unmapped(const void *p) {
  void *page = (void *)((uintptr_t)p & ~(uintptr_t)(sysconf(_SC_PAGESIZE) - 1));
  return msync(page, 1, MS_ASYNC) == -1 && errno == ENOMEM;
}

/* refused() for a range holding the hole at `hole`. Anything of the
 * process (a sanitizer's runtime, the driver's own reading of
 * /proc/self/maps) may map a page into the hole meanwhile: the kernel puts
 * a new mapping in the highest gap that fits, and a hole in the newest
 * mapping is one (AddressSanitizer and ThreadSanitizer filled them, in CI).
 * A case whose hole is filled before or during the call proves nothing and
 * is let pass, with a note (cr_log_info: Criterion 2.4 ends a run that
 * logged a warning with exit status 1, so cr_log_info failed the test); a
 * registration that succeeds with the hole still there fails the test. */
static void refused_hole(void *p, size_t n, unsigned flags, void *hole,
                         const char *why) {
  if (!unmapped(hole)) {
    cr_log_info("%s: the hole was filled before the call", why);
    return;
  }
  CUresult r = drv.reg(p, n, flags);
  if (r == CUDA_SUCCESS && !unmapped(hole)) {
    cr_log_info("%s: the hole was filled during the call", why);
    cr_assert_eq(drv.unreg(p), CUDA_SUCCESS);
    return;
  }
  cr_assert_neq(r, CUDA_SUCCESS, "%s: registered", why);
  if (!fk_is_real())
    cr_assert_eq(r, CUDA_ERROR_INVALID_VALUE, "%s: %d", why, (int)r);
  cr_assert_eq(drv.unreg(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
               "%s: a failed registration registered the range", why);
}

/* Five pages of which the test owns those whose bit is set in `own`: a
 * hole is made just before the call that needs it and taken back after, so
 * a page something else mapped into a hole is never the test's to unmap
 * (unmapping all five pages unmapped ThreadSanitizer's page, which then
 * faulted, in CI). */
struct pages {
  unsigned char *m;
  size_t page;
  unsigned own;
};

/* Unmaps page i if the test owns it (a page something else mapped into an
 * earlier hole is not the test's: refused_hole() then finds the hole
 * filled). */
static void punch(struct pages *pg, unsigned i) {
  if (!(pg->own & 1u << i))
    return;
  cr_assert_eq(munmap(pg->m + i * pg->page, pg->page), 0);
  pg->own &= ~(1u << i);
}

/* Maps page i again where nothing else has (MAP_FIXED_NOREPLACE: a kernel
 * before 4.17 takes it as a hint, so an address elsewhere is given back). */
static void refill(struct pages *pg, unsigned i) {
  void *want = pg->m + i * pg->page;
  void *got = mmap(want, pg->page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (got == want)
    pg->own |= 1u << i;
  else if (got != MAP_FAILED)
    cr_assert_eq(munmap(got, pg->page), 0);
}

/* refused_hole() for [at, at + n) with page `hole` punched for the call. */
static void refused_punched(struct pages *pg, size_t at, size_t n,
                            unsigned flags, unsigned hole, const char *why) {
  punch(pg, hole);
  refused_hole(pg->m + at, n, flags, pg->m + hole * pg->page, why);
  refill(pg, hole);
}

/* Pages mapped nowhere cannot be page-locked: a range with such a hole, at
 * its start, inside or at its end, is refused, with or without
 * CU_MEMHOSTREGISTER_READ_ONLY, and so is a page mapped PROT_NONE (no
 * access to lock); the mapped pages alone register. Before, the fake took
 * the hole: it looked only for pages mapped without write access. */
Test(fakecuda_host_register, a_range_with_a_page_mapped_nowhere_is_refused) {
  int ro = attribute(CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  /* Pages 0, 2 and 4 stay mapped, 1 and 3 are the holes; 4 is made
   * PROT_NONE at the end. */
  struct pages pg = {.page = page, .own = 0x1f};
  pg.m = mmap(NULL, 5 * page, PROT_READ | PROT_WRITE,
              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(pg.m, MAP_FAILED);
  unsigned char *m = pg.m;
  refused_punched(&pg, 0, 3 * page, 0, 1, "a hole inside");
  if (ro)
    refused_punched(&pg, 0, 3 * page, CU_MEMHOSTREGISTER_READ_ONLY, 1,
                    "a hole inside, READ_ONLY");
  refused_punched(&pg, page, 2 * page, CU_MEMHOSTREGISTER_DEVICEMAP, 1,
                  "a hole first");
  refused_punched(&pg, 2 * page, 2 * page, 0, 3, "a hole last");
  refused_punched(&pg, page, page, 0, 1, "nothing mapped");
  refused_punched(&pg, 2 * page - 8, 16, 0, 1,
                  "a few bytes across a hole's end");
  punch(&pg, 1);
  punch(&pg, 3);
  cr_assert_eq(drv.reg(m + 2 * page, page, 0), CUDA_SUCCESS,
               "a mapped page between two holes");
  cr_assert_eq(drv.unreg(m + 2 * page), CUDA_SUCCESS);
  cr_assert_eq(mprotect(m + 4 * page, page, PROT_NONE), 0);
  refused(m + 4 * page, page, 0, "a PROT_NONE page");
  if (ro)
    refused(m + 4 * page, page, CU_MEMHOSTREGISTER_READ_ONLY,
            "a PROT_NONE page, READ_ONLY");
  cr_assert_eq(drv.reg(m, page, 0), CUDA_SUCCESS);
  cr_assert_eq(drv.unreg(m), CUDA_SUCCESS);
  for (unsigned i = 0; i < 5; i++)
    if (pg.own & 1u << i)
      cr_assert_eq(munmap(m + i * page, page), 0);
}

/* The /proc/self/maps line of the mapping at addr, copied into line (n
 * bytes); its length, 0 when there is none. */
static size_t maps_line(const void *addr, char *line, size_t n) {
  FILE *f = fopen("/proc/self/maps", "r");
  cr_assert_not_null(f);
  char *l = NULL;
  size_t cap = 0, len = 0;
  unsigned long a = 0;
  while (getline(&l, &cap, f) != -1)
    if (sscanf(l, "%lx-", &a) == 1 && a == (uintptr_t)addr) {
      len = strlen(l);
      snprintf(line, n, "%s", l);
      break;
    }
  free(l);
  fclose(f);
  return len;
}

/* A mapping of a file whose path is long makes a /proc/self/maps line
 * longer than any fixed buffer (proc(5): "address perms offset dev inode
 * pathname"). Here the file's name, read from the line's 512th character
 * on, is the text of a read-only mapping of a writable range: read in
 * pieces, the fake took the piece for a line and refused the writable range
 * as read-only (CU_MEMHOSTREGISTER_READ_ONLY "is required in order to
 * register memory mapped to the CPU as read-only", cuda.h); read whole, it
 * registers. The file's own mapping, read-only, still needs the flag. */
Test(fakecuda_host_register, a_long_maps_line_is_read_as_one_line) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char *rw = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(rw, MAP_FAILED);
  char tmpl[] = "/tmp/fk_maps_XXXXXX", dir[PATH_MAX], path[PATH_MAX + 8];
  cr_assert_not_null(mkdtemp(tmpl));
  cr_assert_not_null(realpath(tmpl, dir)); /* as the kernel writes it */
  snprintf(path, sizeof path, "%s/f", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  cr_assert_eq(fputc('x', f), 'x');
  cr_assert_eq(fclose(f), 0);
  FILE *rf = fopen(path, "r");
  cr_assert_not_null(rf);
  void *fm = mmap(NULL, page, PROT_READ, MAP_PRIVATE, fileno(rf), 0);
  cr_assert_neq(fm, MAP_FAILED);
  fclose(rf);
  /* Where the path starts in the line; then directories so that the file's
   * name starts at character 511 (0-based), past a 512-byte buffer. */
  char line[2 * PATH_MAX];
  cr_assert_gt(maps_line(fm, line, sizeof line), 0);
  char *slash = strchr(line, '/');
  cr_assert_not_null(slash);
  long fill = 511 - (slash - line) - (long)strlen(dir) - 1;
  cr_assert_gt(fill, 1, "the line's prefix is too long: %s", line);
  char sub[PATH_MAX], dirs[8][PATH_MAX];
  int ndirs = 0;
  snprintf(sub, sizeof sub, "%s", dir);
  while (fill > 0) {
    long c = fill > 256 ? 200 : fill - 1; /* a component and its '/' */
    size_t at = strlen(sub);
    sub[at] = '/';
    memset(sub + at + 1, 'd', (size_t)c);
    sub[at + 1 + c] = '\0';
    cr_assert_eq(mkdir(sub, 0700), 0);
    snprintf(dirs[ndirs++], PATH_MAX, "%s", sub);
    fill -= c + 1;
  }
  char fake[128], moved[PATH_MAX + 128];
  snprintf(fake, sizeof fake, "%lx-%lx r--p", (unsigned long)(uintptr_t)rw,
           (unsigned long)(uintptr_t)rw + page);
  snprintf(moved, sizeof moved, "%s/%s", sub, fake);
  cr_assert_eq(rename(path, moved), 0);
  size_t len = maps_line(fm, line, sizeof line);
  cr_assert_gt(len, 512, "the line: %s", line);
  cr_assert_eq(strncmp(line + 511, fake, strlen(fake)), 0,
               "the name is not at 511: %s", line);

  cr_assert_eq(drv.reg(rw, 2 * page, 0), CUDA_SUCCESS,
               "a writable range taken for the file name's text");
  cr_assert_eq(drv.unreg(rw), CUDA_SUCCESS);
  if (!attribute(
          CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES))
    refused(fm, page, 0, "the file's read-only mapping");

  cr_assert_eq(munmap(fm, page), 0);
  cr_assert_eq(munmap(rw, 2 * page), 0);
  cr_assert_eq(unlink(moved), 0);
  while (ndirs > 0)
    cr_assert_eq(rmdir(dirs[--ndirs]), 0);
  cr_assert_eq(rmdir(dir), 0);
}
