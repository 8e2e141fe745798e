/* vm_unmap of the host device fences the range it unmaps again (PROT_NONE,
 * still taken inside its reservation, so that no other mmap lands there).
 * Where the kernel refuses the fence's mmap (ENOMEM: the process has too
 * many mappings), the unmap makes the mapping itself PROT_NONE instead;
 * where that is refused too, the unmap is MP_ENOMEM and changes nothing:
 * the range stays mapped and charged, and its reservation busy. The
 * kernel's refusals are made by a seccomp filter that answers ENOMEM to an
 * mmap (and an mprotect) of exactly the range with PROT_NONE. */
#include <criterion/criterion.h>
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "device/backend.h"

#include "../support/device_helpers.h"

#define MiB ((size_t)1 << 20)

#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i))
#define ARG_HI(i) (ARG_LO(i) + 4)

/* Jumps past its rules unless the call is sysno; then ENOMEM when its first
 * argument is addr and its third PROT_NONE. */
#define REFUSE_FENCE(sysno, addr)                                              \
  BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),       \
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (sysno), 0, 7),                      \
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(0)),                           \
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)(addr), 0, 5),             \
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_HI(0)),                           \
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)((addr) >> 32), 0, 3),     \
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(2)),                           \
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PROT_NONE, 0, 1),                    \
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOMEM)

/* From now on in this process (Criterion runs each test in its own),
 * mmap of addr with PROT_NONE fails with ENOMEM, and mprotect of addr to
 * PROT_NONE too when also_mprotect. Skips the test where a filter cannot
 * be installed. */
static void refuse_fence(void *p, bool also_mprotect) {
  uint64_t a = (uint64_t)(uintptr_t)p;
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      REFUSE_FENCE(__NR_mmap, a),
      REFUSE_FENCE(also_mprotect ? __NR_mprotect : __NR_mmap, a),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof f / sizeof *f, .filter = f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0)
    cr_skip_test("no seccomp filter here: %s", strerror(errno));
  /* The filter works: an mmap of the range with PROT_NONE is refused. */
  cr_assert_eq(mmap(p, 4096, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0),
               MAP_FAILED);
  cr_assert_eq(errno, ENOMEM);
}

/* Whether the process may read p: a pipe's write from memory it may not
 * read is EFAULT, not a fault. */
static bool readable(const void *p) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  bool ok = write(fds[1], p, 1) == 1;
  close(fds[0]);
  close(fds[1]);
  return ok;
}

static mp_device_t *dev;
static char *base;
static size_t free0;

static void map_one(void) {
  dev = open_dev("host:capacity=64M,granularity=2M");
  free0 = free_bytes(dev);
  cr_assert_eq(mp__device_vm_reserve(dev, 6 * MiB, (void **)&base), MP_OK);
  cr_assert_eq(mp__device_vm_map(dev, base + 2 * MiB, 2 * MiB), MP_OK, "%s",
               mp_last_error());
  memset(base + 2 * MiB, 0x5a, 2 * MiB);
}

#if defined(__x86_64__)
Test(host_vm_unmap_fence, a_refused_fence_mmap_still_fences_the_range) {
  map_one();
  refuse_fence(base + 2 * MiB, false);
  cr_assert_eq(mp__device_vm_unmap(dev, base + 2 * MiB, 2 * MiB), MP_OK, "%s",
               mp_last_error());
  cr_expect_not(readable(base + 2 * MiB), "the unmapped range is fenced");
  cr_expect_eq(free_bytes(dev), free0);
  /* Mapped again, it reads zeros, and the reservation goes. */
  cr_assert_eq(mp__device_vm_map(dev, base + 2 * MiB, 2 * MiB), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(base[2 * MiB], 0);
  cr_expect_eq(mp__device_vm_unmap(dev, base + 2 * MiB, 2 * MiB), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp__device_vm_release(dev, base, 6 * MiB), MP_OK, "%s",
               mp_last_error());
}

Test(host_vm_unmap_fence, an_unfenceable_range_stays_mapped) {
  map_one();
  refuse_fence(base + 2 * MiB, true);
  cr_assert_eq(mp__device_vm_unmap(dev, base + 2 * MiB, 2 * MiB), MP_ENOMEM);
  cr_expect(strstr(mp_last_error(), "fence") != NULL, "%s", mp_last_error());
  cr_expect(readable(base + 2 * MiB));
  cr_expect_eq(base[2 * MiB + 7], 0x5a, "the data stays");
  cr_expect_eq(free_bytes(dev), free0 - 2 * MiB, "still charged");
  cr_expect_eq(mp__device_vm_release(dev, base, 6 * MiB), MP_EBUSY);
}
#endif
