"""kvfence's error classes (package errdefs), as Python exceptions.

The C ABI returns the class number plus one; each class is a subclass of
KVFenceError, so callers catch exactly what they can handle (for example
ResourceExhausted: the pool is full, retry later).
"""

UNKNOWN, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, UNAVAILABLE = 1, 2, 3, 4, 5
FAILED_PRECONDITION, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 6, 7, 8, 9


class KVFenceError(Exception):
    """A classified kvfence error: .code is the C ABI's code, .message the text."""

    code = UNKNOWN

    def __init__(self, message):
        super().__init__(message)
        self.message = message


class Unknown(KVFenceError):
    code = UNKNOWN


class InvalidArgument(KVFenceError, ValueError):
    code = INVALID_ARGUMENT


class NotFound(KVFenceError, LookupError):
    code = NOT_FOUND


class AlreadyExists(KVFenceError):
    code = ALREADY_EXISTS


class Unavailable(KVFenceError):
    """The transfer did not complete; nothing about its memory follows from it."""

    code = UNAVAILABLE


class FailedPrecondition(KVFenceError):
    code = FAILED_PRECONDITION


class ResourceExhausted(KVFenceError):
    """The pool is full (holds count): retry later."""

    code = RESOURCE_EXHAUSTED


class Unimplemented(KVFenceError, NotImplementedError):
    code = UNIMPLEMENTED


class Internal(KVFenceError):
    code = INTERNAL


_BY_CODE = {c.code: c for c in (Unknown, InvalidArgument, NotFound, AlreadyExists, Unavailable,
                                FailedPrecondition, ResourceExhausted, Unimplemented, Internal)}


def from_code(code, message):
    return _BY_CODE.get(code, Unknown)(message)
