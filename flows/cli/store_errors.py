"""One line for an object store (S3 through s3fs/botocore) that still fails after its clients' retries: unavailable,
throttling, timing out or unreachable. Such a failure is the store's answer, not a bug in clipcache; the cache's and
the results' writes are atomic or resumable, so what finished is kept and the same command continues once the store
answers again.

Only the store's own answers are recognised: a botocore ``ClientError`` with a 5xx/429 status or a throttling code
(s3fs turns it into an ``OSError`` -- EBUSY for 503 SlowDown/ServiceUnavailable, EREMOTEIO for 500 -- with the
``ClientError`` as its ``__cause__``), or a connection/timeout error of botocore, aiohttp or fsspec, itself or as a
cause. A denied request (a 403, an expired token, a wrong key: storage/store_answers.py) is one line too, naming the
credentials to check. A missing key, a local EBUSY or any other exception keeps its traceback."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from clipcache.storage.store_answers import causes, client_answer, denied, said

# error codes that S3 (and S3-compatible stores) answer when they are overloaded or briefly unavailable
TRANSIENT_CODES = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "OperationAborted",
                             "Throttling", "ThrottlingException", "TooManyRequests", "RequestLimitExceeded"})


def _connection_types() -> tuple[type[BaseException], ...]:
    """The connection and timeout errors of the store clients already imported (one not imported raised nothing)."""
    found: list[type[BaseException]] = []
    if botocore := sys.modules.get("botocore.exceptions"):
        found += [botocore.ConnectionError, botocore.HTTPClientError]  # refused, DNS, connect/read timeouts, reset
    if aiohttp := sys.modules.get("aiohttp"):
        found += [aiohttp.ClientConnectionError]  # connector errors, server disconnected, server timeouts
    if fsspec := sys.modules.get("fsspec.exceptions"):
        found += [fsspec.FSTimeoutError]  # fsspec's own timeout of an async store call
    return tuple(found)


def _what(error: BaseException) -> str | None:
    """What the store answered, when ``error`` (or a cause) is a store's failure after retries; None otherwise."""
    connection = _connection_types()
    for e in causes(error):
        if (answer := client_answer(e)) is not None:
            status, code, operation = answer
            if status >= 500 or status == 429 or code in TRANSIENT_CODES:
                return f"answered {said(status, code)} to {operation}"
            return None  # the store's answer, but one about the request (missing key, denied...): not this kind
        if connection and isinstance(e, connection):
            endpoint = getattr(e, "kwargs", {}).get("endpoint_url")
            first = (str(e).splitlines() or [""])[0]
            return f"could not be reached{f' at {endpoint}' if endpoint else ''} ({type(e).__name__}: {first})"
    return None


def store_problem(error: BaseException, where: Sequence[str] = ()) -> str | None:
    """One line naming the store problem and the remote locations in use, or None when ``error`` is not one."""
    store = f"the object store ({', '.join(where)})" if where else "the object store"
    if (refused := denied(error)) is not None:  # not retried: the same credentials get the same answer
        return f"{store} {refused}; finished work is kept, so the same command continues once access is fixed"
    what = _what(error)
    if what is None:
        return None
    return (f"{store} {what}, after the client's retries: finished work is kept, so the same command continues once "
            f"the store answers (AWS_MAX_ATTEMPTS sets how many attempts botocore makes)")
