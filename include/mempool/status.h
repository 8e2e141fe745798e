/* mempool/status.h - status codes shared by every mempool call.
 *
 * Every call returns an mp_status_t and passes results out through pointers.
 * A call that fails changes nothing the caller can observe, apart from
 * counters and cached memory that an allocation released while making room.
 * The status codes come from one X-macro list, so that the enum, the names
 * and the messages cannot drift apart. */
#ifndef MEMPOOL_STATUS_H
#define MEMPOOL_STATUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MP_API
#else
#define MP_API __attribute__((visibility("default")))
#endif

/* X(name, message) */
#define MP_STATUS_LIST(X)                                                      \
  X(MP_OK, "success")                                                          \
  X(MP_EINVAL, "invalid argument")                                             \
  X(MP_ENOMEM, "out of device memory")                                         \
  X(MP_ELIMIT, "configured limit exceeded")                                    \
  X(MP_ENODEV, "device backend not available")                                 \
  X(MP_EDRIVER, "device driver error")                                         \
  X(MP_EBUSY, "object still in use")                                           \
  X(MP_ENOTSUP, "operation not supported by the backend")                      \
  X(MP_ECORRUPT, "internal invariant broken")                                  \
  X(MP_EIO, "input/output error")

typedef enum mp_status {
#define MP__STATUS_ENUM(name, msg) name,
  MP_STATUS_LIST(MP__STATUS_ENUM)
#undef MP__STATUS_ENUM
} mp_status_t;

/* A short English message for s; never NULL ("unknown status" otherwise). */
MP_API const char *mp_status_string(mp_status_t s);

/* The enumerator's name ("MP_EINVAL"); never NULL. */
MP_API const char *mp_status_name(mp_status_t s);

/* A one-line description of the last failure in the calling thread, naming
 * what was wrong ("bad device spec: unknown key 'capcity'", "out of memory:
 * asked 1.0 GiB, reserved ..."). Empty string when the thread has seen no
 * failure. A later success does not clear it; the next failure replaces it.
 * One success records a failure: on CUDA, a call that was done but whose
 * driver then refused to give the calling thread back its stream-capture
 * mode (cuThreadExchangeStreamCaptureMode) returns its success and leaves
 * that refusal here, as the thread is left in a mode it did not choose.
 * Input it quotes (an option string, a spec) is shortened when long, the
 * cut between characters, and shows control characters and bytes that are
 * not well-formed UTF-8 as '?'. */
MP_API const char *mp_last_error(void);

/* The status of the failure mp_last_error() describes (MP_OK when the
 * thread has seen none): for the calls that return a pointer rather than a
 * status (mp_default_pool's NULL), and for bindings that raise a status's
 * exception from it. Like the message, a later success leaves it. */
MP_API mp_status_t mp_last_status(void);

/* The driver's own error code (a CUresult of cuda.h) when the failure
 * mp_last_status() names is MP_EDRIVER from a CUDA driver call the library
 * made (CUDA_ERROR_ILLEGAL_ADDRESS, 700, once a kernel's fault has left the
 * context unusable, say); 0 for any other failure and when the thread has
 * seen none. A shim that stands in for the driver answers with it rather
 * than with a code of its own. Like the message, a later success leaves
 * it. */
MP_API int mp_last_driver_error(void);

/* The bytes of mp_last_error()'s message, its terminating NUL included:
 * the message is never longer, so an mp_error_state_t holds it whole.
 * Part of the layout below: it never changes. */
#define MP_ERROR_MESSAGE_MAX 512

/* The layout mp_error_save() writes, in mp_error_state_t's version field. */
#define MP_ERROR_STATE_VERSION 1u

/* The calling thread's last error, whole: what mp_last_status(),
 * mp_last_driver_error() and mp_last_error() give.
 *
 * Growing: the struct's size and the place of every field here never
 * change (592 bytes, the message at byte 80, on every ABI with a 4-byte
 * int: pad keeps reserved at byte 16 where uint64_t is 4-byte aligned). A
 * later version takes the room of its new fields out of reserved, writes
 * its number in version, and reads a state of every earlier version (the
 * fields that state lacks count as zero); a program built against an
 * older header keeps working with a newer library, and the reverse, as
 * neither ever writes past the other's struct. So:
 *  - fill a state with mp_error_save() (it writes version and zeroes pad
 *    and reserved); one built by hand sets version to
 *    MP_ERROR_STATE_VERSION and every other byte but the message's to 0;
 *  - a state whose version this library does not know (0, a state never
 *    filled, or one of a later version built by hand) is ignored by
 *    mp_error_restore(): the thread's last error stays as it was;
 *  - bindings that cannot read this header (Python's ctypes) allocate
 *    mp_error_state_size() bytes, 8-byte aligned, and need no field. */
typedef struct mp_error_state {
  unsigned version; /* MP_ERROR_STATE_VERSION (mp_error_save writes it) */
  mp_status_t status;
  int driver_error;
  /* 0: puts reserved at byte 16 on every ABI (i386 aligns uint64_t in a
   * struct at 4, which would leave it at 12 and the struct 588 bytes). */
  unsigned pad;
  uint64_t reserved[8]; /* 0: the room of later versions' fields */
  char message[MP_ERROR_MESSAGE_MAX];
} mp_error_state_t;

/* sizeof(mp_error_state_t) as this library has it (592): for bindings
 * that allocate a state without this header. */
MP_API size_t mp_error_state_size(void);

/* Copies the calling thread's last error into *out (its message
 * NUL-terminated, version MP_ERROR_STATE_VERSION, reserved zeroed), for
 * cleanup code that may fail while the caller is still to read a failure:
 * a destructor, a finalizer, an unwinding path that destroys what it made.
 * mp_error_restore() then puts it back, so that the cleanup's own failure
 * does not replace it. NULL: nothing. */
MP_API void mp_error_save(mp_error_state_t *out);

/* Makes *in the calling thread's last error: mp_last_status(),
 * mp_last_driver_error() and mp_last_error() give its status, driver code
 * and message, as they gave them when mp_error_save() filled it. The
 * message is read up to its first NUL and at most MP_ERROR_MESSAGE_MAX - 1
 * bytes: one not terminated within the array is cut there. Other threads'
 * errors are untouched. NULL, or a version this library does not know
 * (see mp_error_state_t): nothing, the last error left as it was. */
MP_API void mp_error_restore(const mp_error_state_t *in);

#ifdef __cplusplus
}
#endif
#endif /* MEMPOOL_STATUS_H */
