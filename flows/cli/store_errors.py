"""One line for an object store (S3 through s3fs/botocore) that still fails after its clients' retries: unavailable,
throttling, timing out or unreachable. Such a failure is the store's answer, not a bug in clipcache; the cache's and
the results' writes are atomic or resumable, so what finished is kept and the same command continues once the store
answers again.

Only the store's own answers are recognised: a botocore ``ClientError`` with a 5xx/429 status or a throttling code
(s3fs turns it into an ``OSError`` -- EBUSY for 503 SlowDown/ServiceUnavailable, EREMOTEIO for 500 -- with the
``ClientError`` as its ``__cause__``), or a connection/timeout error of botocore, aiohttp or fsspec, itself or as a
cause. A missing key, a denied request, a local EBUSY or any other exception keeps its traceback."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence

# error codes that S3 (and S3-compatible stores) answer when they are overloaded or briefly unavailable
TRANSIENT_CODES = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "OperationAborted",
                             "Throttling", "ThrottlingException", "TooManyRequests", "RequestLimitExceeded"})


def _causes(error: BaseException) -> Iterator[BaseException]:
    """``error`` and its explicit causes (``raise ... from``), as s3fs chains a translated error to botocore's."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        yield current
        current = current.__cause__


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
    botocore = sys.modules.get("botocore.exceptions")
    connection = _connection_types()
    for e in _causes(error):
        if botocore is not None and isinstance(e, botocore.ClientError):
            response = getattr(e, "response", None) or {}
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            code = str(response.get("Error", {}).get("Code", ""))
            if status >= 500 or status == 429 or code in TRANSIENT_CODES:
                said = " ".join(str(x) for x in (status or "", code if code != str(status) else "") if x)
                return f"answered {said or 'an error'} to {e.operation_name}"
            return None  # the store's answer, but one about the request (missing key, denied...): not ours to word
        if connection and isinstance(e, connection):
            endpoint = getattr(e, "kwargs", {}).get("endpoint_url")
            first = (str(e).splitlines() or [""])[0]
            return f"could not be reached{f' at {endpoint}' if endpoint else ''} ({type(e).__name__}: {first})"
    return None


def store_problem(error: BaseException, where: Sequence[str] = ()) -> str | None:
    """One line naming the store problem and the remote locations in use, or None when ``error`` is not one."""
    what = _what(error)
    if what is None:
        return None
    store = f"the object store ({', '.join(where)})" if where else "the object store"
    return (f"{store} {what}, after the client's retries: finished work is kept, so the same command continues once "
            f"the store answers (AWS_MAX_ATTEMPTS sets how many attempts botocore makes)")
