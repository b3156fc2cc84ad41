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

/* Argument ranges. A call given anything outside them returns
 * KVFENCE_E_INVALID_ARGUMENT (poll-style calls: its negation) and changes
 * nothing; the process is never brought down by an argument.
 *   - Pointers: NULL where the call needs memory, or memory that is not
 *     mapped for the access (a fault while kvfence reads or writes it), is
 *     INVALID_ARGUMENT. kvfence_error and size_t *needed may be NULL; an
 *     error struct that cannot be written is left unfilled. Arrays of
 *     pointers and of int64_t must be 8-byte aligned where a call says so
 *     (the layout and state calls), else INVALID_ARGUMENT.
 *     Not covered: a non-NULL pointer below 4096 (e.g. a field of a NULL
 *     struct), which the Go runtime may abort on when it moves a stack.
 *   - config: a NUL-terminated JSON object of at most 1 MiB. Decode:
 *     slots 1..2^24, shard_bytes 1..2^34, shards 0..64 (0: 1), pool
 *     (slots x shards x shard_bytes) at most 2^40 bytes. Prefill:
 *     source_pages 1..2^24, shard_bytes 1..2^34, source pool at most
 *     2^40 bytes, lanes/max_inflight/max_batch_pages 0..65536 (0: the
 *     default). Every *_ms field 0..604800000 (0: the default).
 *   - pages (receiver_init, sender_init): 1..2^24; upto, total: 0..2^24;
 *     a page range [first, first+count) must lie in the request.
 *   - ranks/nranks (receiver_init): 1..shards of the decode rank, checked
 *     before the array is read.
 *   - size_t sizes: the bytes the caller's buffer holds; they must cover
 *     what the call reads or writes (count x page_bytes).
 *   - kvfence_wait timeout_ms: >= 0 (larger than ~292 years is clamped). It
 *     returns -KVFENCE_E_NOT_FOUND at once when another thread closes the
 *     handle and -KVFENCE_E_UNAVAILABLE when its agent closes.
 *   - Timing helpers (kvfence_*_go_ns, for boundary benchmarks only): n is
 *     1..2^24 and the loop stops after about a second of work.
 *   - Handles: a closed or never-opened handle is KVFENCE_E_NOT_FOUND; one
 *     of the wrong kind is KVFENCE_E_INVALID_ARGUMENT. */
#endif
