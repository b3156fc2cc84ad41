/* kvfence C ABI: the types every call shares. bin/kvfence.h inlines this
 * file ahead of the generated function declarations. */
#ifndef KVFENCE_ABI_H
#define KVFENCE_ABI_H
#include <stdint.h>
#include <stddef.h>

/* Filled by every call that takes one (it may be NULL). */
typedef struct kvfence_error {
	int32_t code;      /* KVFENCE_OK or a KVFENCE_E_* code */
	char message[512]; /* NUL-terminated, truncated if longer */
} kvfence_error;

/* Error codes: the errdefs class plus one; 0 is success. */
enum {
	KVFENCE_OK = 0,
	KVFENCE_E_UNKNOWN = 1,
	KVFENCE_E_INVALID_ARGUMENT = 2,
	KVFENCE_E_NOT_FOUND = 3,
	KVFENCE_E_ALREADY_EXISTS = 4,
	KVFENCE_E_UNAVAILABLE = 5,
	KVFENCE_E_FAILED_PRECONDITION = 6,
	KVFENCE_E_RESOURCE_EXHAUSTED = 7,
	KVFENCE_E_UNIMPLEMENTED = 8,
	KVFENCE_E_INTERNAL = 9
};

/* Request states: SGLang's KVPoll values. A poll that fails returns the
 * negated error code instead. */
enum {
	KVFENCE_POLL_FAILED = 0,
	KVFENCE_POLL_BOOTSTRAPPING = 1,
	KVFENCE_POLL_WAITING_FOR_INPUT = 2,
	KVFENCE_POLL_TRANSFERRING = 3,
	KVFENCE_POLL_SUCCESS = 4
};

/* An opaque handle: an agent (decode or prefill side), a receiver or a
 * sender. 0 is never a valid handle. */
typedef uint64_t kvfence_handle;
#endif
