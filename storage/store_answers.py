"""What an object store (S3 through s3fs/botocore) answered, read from the error a client raised: s3fs turns
botocore's ``ClientError`` into an ``OSError``/``PermissionError``/``FileNotFoundError`` with the ``ClientError`` as its
``__cause__``. One home for reading those answers, for the start-up location check (storage/paths.py) and the CLI's
one line for a store that fails mid-run (flows/cli/store_errors.py).

A denied request is one whose credentials or permissions the store refused: a 403, or a code about the credentials
(an expired or malformed session token answers 400). Its remedy is the credentials the S3 client finds; clipcache
passes none of its own. A missing key (404, ``NoSuchKey``) is not a denial: the code that reads asks ``exists`` first
or treats it as absent."""

from __future__ import annotations

import sys
from collections.abc import Iterator

# codes about the request's credentials or permissions (S3's error-response table; the token ones answer 400)
DENIED_CODES = frozenset({"AccessDenied", "AccountProblem", "AllAccessDisabled", "ExpiredToken", "InvalidAccessKeyId",
                          "InvalidToken", "InvalidSecurity", "NotSignedUp", "SignatureDoesNotMatch",
                          "TokenRefreshRequired", "RequestTimeTooSkewed"})
NOT_DENIED = frozenset({"InvalidObjectState"})  # a 403 for an archived object: the object's state, not the caller
# where botocore finds credentials (its documented chain, first found wins), which is where s3fs's clients get them
CREDENTIALS = ("check the credentials the S3 client finds (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
               "AWS_SESSION_TOKEN, else the AWS_PROFILE profile of ~/.aws/credentials and ~/.aws/config, else the "
               "machine's role) and that they may list, read and write there")
CLOCK = "the machine's clock is too far from the store's: set it right (e.g. NTP)"


def causes(error: BaseException) -> Iterator[BaseException]:
    """``error`` and its explicit causes (``raise ... from``), as s3fs chains a translated error to botocore's."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        yield current
        current = current.__cause__


def client_answer(error: BaseException) -> tuple[int, str, str] | None:
    """(HTTP status, error code, operation) when ``error`` itself is botocore's ``ClientError``; None otherwise."""
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is None or not isinstance(error, botocore.ClientError):
        return None
    response = getattr(error, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return int(status), str(response.get("Error", {}).get("Code", "")), str(error.operation_name)


def said(status: int, code: str) -> str:
    """``403 AccessDenied``; ``403`` alone when the code repeats the status (a HEAD answer has no body)."""
    return " ".join(str(x) for x in (status or "", code if code != str(status) else "") if x) or "an error"


def denied(error: BaseException) -> str | None:
    """``denied PutObject (403 InvalidAccessKeyId): check the credentials ...`` when the first store answer among
    ``error`` and its causes refuses the request's credentials or permissions; None otherwise (no secret is read:
    only the status, the code and the operation)."""
    for e in causes(error):
        if (answer := client_answer(e)) is not None:
            status, code, operation = answer
            if code in NOT_DENIED or not (status == 403 or code in DENIED_CODES):
                return None
            return f"denied {operation} ({said(status, code)}): {CLOCK if code == 'RequestTimeTooSkewed' else CREDENTIALS}"
    return None
