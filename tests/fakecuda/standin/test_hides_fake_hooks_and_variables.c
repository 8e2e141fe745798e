/* The stand-in of a real driver (tests/fakecuda, target fakecuda_standin),
 * on which ctest -L standin runs every GPU twin: it must have none of the
 * fake's cuFake* test hooks and read none of the FAKECUDA_* variables, or
 * a twin that asks for them unguarded would pass there and fail on a GPU.
 * The hooks are every cuFake* function the fake's source names, and the
 * driver's entry points (which it must keep) every one the source defines,
 * so a new one is checked too; the normal fake, beside it, has them all and
 * reads the variables, so the same checks see the difference.
 *
 * FK_FAKE_LIB and FK_STANDIN_LIB are the two libraries' paths, FK_FAKE_SRC
 * the fake's source (compile definitions, tests/fakecuda/CMakeLists.txt). */
#include <ctype.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <cuda.h>

#define FK_MAX_NAMES 512
#define FK_NAME_MAX  64

/* The names fakecuda.c gives functions: with hooks, every cuFake* name
 * followed by '(' (defined or declared), else every driver entry point it
 * defines as "CUresult cuName(" at the start of a line. n: how many. */
static int source_names(bool hooks, char names[][FK_NAME_MAX]) {
  FILE *f = fopen(FK_FAKE_SRC, "r");
  cr_assert_not_null(f, "cannot read %s", FK_FAKE_SRC);
  int n = 0;
  char line[1024];
  while (fgets(line, sizeof line, f) != NULL) {
    const char *key = hooks ? "cuFake" : "CUresult cu";
    for (char *p = strstr(line, key); p != NULL; p = strstr(p + 1, key)) {
      if (!hooks) {
        if (p != line)
          break;
        p += strlen("CUresult ");
      }
      size_t len = 0;
      while (isalnum((unsigned char)p[len]) || p[len] == '_')
        len++;
      if (p[len] != '(' || len >= FK_NAME_MAX ||
          (!hooks && strncmp(p, "cuFake", 6) == 0))
        continue;
      bool seen = false;
      for (int i = 0; i < n && !seen; i++)
        seen = strlen(names[i]) == len && strncmp(names[i], p, len) == 0;
      if (!seen) {
        cr_assert_lt(n, FK_MAX_NAMES);
        memcpy(names[n], p, len);
        names[n][len] = '\0';
        n++;
      }
    }
  }
  fclose(f);
  cr_assert_gt(n, 0, "no %s function in %s", hooks ? "cuFake*" : "driver",
               FK_FAKE_SRC);
  return n;
}

static void *open_lib(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(h, "dlopen %s: %s", path, dlerror());
  return h;
}

/* Each name of the source (source_names) is the fake's, and the stand-in's
 * unless it is a hook. */
static void check_names(bool hooks) {
  static char names[FK_MAX_NAMES][FK_NAME_MAX];
  int n = source_names(hooks, names);
  void *fake = open_lib(FK_FAKE_LIB);
  void *standin = open_lib(FK_STANDIN_LIB);
  for (int i = 0; i < n; i++) {
    cr_expect_not_null(dlsym(fake, names[i]), "the fake lacks %s", names[i]);
    bool there = dlsym(standin, names[i]) != NULL;
    cr_expect_eq(there, !hooks, "the stand-in %s %s",
                 hooks ? "exports" : "lacks", names[i]);
  }
}

Test(standin, has_none_of_the_fakes_hooks) {
  check_names(true);
}

Test(standin, has_every_driver_entry_point_of_the_fake) {
  check_names(false);
}

/* fp = the function name of the library h, typed as fp is. */
#define LOAD(fp, h, name)                                                      \
  do {                                                                         \
    void *sym_ = dlsym(h, name);                                               \
    cr_assert_not_null(sym_, "no %s", name);                                   \
    memcpy(&(fp), &sym_, sizeof sym_);                                         \
  } while (0)

/* What the library at path answers after cuInit, with the variables set. */
struct answers {
  CUresult init;
  int count, version;
  char name[256];
};

static struct answers ask(const char *path) {
  setenv("FAKECUDA_DEVICE_COUNT", "3", 1);
  setenv("FAKECUDA_DRIVER_VERSION", "11020", 1);
  setenv("FAKECUDA_NAME", "not a stand-in", 1);
  void *h = open_lib(path);
  CUresult (*init)(unsigned);
  CUresult (*get_count)(int *);
  CUresult (*get_version)(int *);
  CUresult (*get_name)(char *, int, CUdevice);
  LOAD(init, h, "cuInit");
  LOAD(get_count, h, "cuDeviceGetCount");
  LOAD(get_version, h, "cuDriverGetVersion");
  LOAD(get_name, h, "cuDeviceGetName");
  struct answers a = {0};
  a.init = init(0);
  cr_assert_eq(a.init, CUDA_SUCCESS);
  cr_assert_eq(get_count(&a.count), CUDA_SUCCESS);
  cr_assert_eq(get_version(&a.version), CUDA_SUCCESS);
  cr_assert_eq(get_name(a.name, (int)sizeof a.name, 0), CUDA_SUCCESS);
  return a;
}

Test(standin, reads_no_fakecuda_variable) {
  unsetenv("MEMPOOL_STANDIN_DEVICES"); /* one device: the machine's */
  struct answers a = ask(FK_STANDIN_LIB);
  cr_expect_eq(a.count, 1, "FAKECUDA_DEVICE_COUNT was read");
  cr_expect_eq(a.version, CUDA_VERSION, "FAKECUDA_DRIVER_VERSION was read");
  cr_expect_str_neq(a.name, "not a stand-in", "FAKECUDA_NAME was read");
}

/* The number of GPUs is the machine's: MEMPOOL_STANDIN_DEVICES, never the
 * program's FAKECUDA_DEVICE_COUNT (ask sets 3). */
Test(standin, has_the_devices_the_machine_has) {
  setenv("MEMPOOL_STANDIN_DEVICES", "2", 1);
  struct answers a = ask(FK_STANDIN_LIB);
  cr_expect_eq(a.count, 2, "MEMPOOL_STANDIN_DEVICES=2 was not read");
}

/* The same variables do reach the normal fake: the check above can fail. */
Test(standin, the_normal_fake_reads_them) {
  struct answers a = ask(FK_FAKE_LIB);
  cr_expect_eq(a.count, 3);
  cr_expect_eq(a.version, 11020);
  cr_expect_str_eq(a.name, "not a stand-in");
}

/* A variable that would stop cuInit on the fake leaves the stand-in be. */
Test(standin, starts_whatever_the_variables_say) {
  setenv("FAKECUDA_NO_DEVICE", "1", 1);
  setenv("FAKECUDA_INIT_ERROR", "999", 1);
  struct answers a = ask(FK_STANDIN_LIB);
  cr_expect_eq(a.init, CUDA_SUCCESS);
}
