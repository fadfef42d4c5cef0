"""An object store that keeps failing after botocore's and s3fs's retries (503s from a proxy in front of the real S3
API): the CLI ends in one line naming the store, not a traceback, and the same command then finishes against the
healthy store with the numbers of a local run. A store that refuses the credentials (moto's own access control: a
wrong key from the start, or a key refused from some point of a run on) is one line naming what to check, and the
same command then finishes too. Errors that are not the store's answer (a missing key, a local EBUSY, a bug) keep
their traceback (flows/cli/store_errors.py, storage/store_answers.py)."""

from __future__ import annotations

import errno
import json

import pytest

from clipcache.flows.cli.store_errors import store_problem
from clipcache.storage.embedding_store import EmbeddingStore

from test_faults import (
    EVAL,
    FlakyS3Proxy,
    _close_zygote,  # noqa: F401  (its autouse fixture closes the CLI zygote after this module)
    eval_argv,
    results,
    run,
    short_waits_between_retries,
)

SHORT = [*EVAL, "--limit", "32"]  # the last --limit counts: a tiny eval


class FailsAfter(FlakyS3Proxy):
    """The first ``healthy`` requests pass through; every later one is answered 503 SlowDown (a store that goes down
    mid-run and stays down through every retry)."""

    def __init__(self, upstream: str, healthy: int) -> None:
        self.healthy = healthy
        super().__init__(upstream, error_rate=0.0, delay_rate=0.0)

    @property  # type: ignore[override]
    def error_rate(self) -> float:  # read by the proxy once per request, after counting it
        return 0.0 if self.requests <= self.healthy else 1.0

    @error_rate.setter
    def error_rate(self, value: float) -> None:
        pass


def moto_auth(endpoint: str, unauthenticated: float) -> None:
    """moto's documented switch of its IAM-like access control in server mode (``POST /moto-api/reset-auth``, the
    number of requests still let through unchecked): from then on a request signed with a key moto's IAM does not
    hold, as the tests' ``testing`` key, is answered 403 InvalidAccessKeyId, as S3 answers a wrong or withdrawn key.
    ``inf``: unchecked again."""
    import urllib.request

    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=str(unauthenticated).encode(),
                                     method="POST", headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200


@pytest.mark.faults
def test_a_store_down_or_denying_mid_run_is_one_line_then_the_same_command_finishes(s3_endpoint, bucket, tmp_path):
    cache, out = f"s3://{bucket}/cache", f"s3://{bucket}/results"
    argv = [*SHORT, "--cache_dir", cache, "--output_dir", out]
    extra = {"CLIPCACHE_LOCAL_DIR": str(tmp_path / "local"), **short_waits_between_retries(tmp_path / "botocore")}
    wrong = {"AWS_ACCESS_KEY_ID": "AKIAWRONGKEY0000TEST", "AWS_SECRET_ACCESS_KEY": "not-the-secret-5f3a9c"}
    # 503s: healthy=0, the start-up check of the bucket meets them; healthy=12, the bucket checks pass, the run's
    # writes then meet them. Denials (moto's own access control): a wrong key from the first request on; the
    # tests' key accepted for 12 requests, then refused (credentials withdrawn or expired mid-run).
    for healthy, denying, code, said in ((0, None, 2, f"cache_dir: cannot reach {cache}"),
                                         (12, None, 1, "the object store"),
                                         (None, 0, 2, f"cache_dir: {cache} denied HeadBucket (403)"),
                                         (None, 12, 1, f"the object store ({cache}, {out}) denied ")):
        proxy = FailsAfter(s3_endpoint, healthy) if healthy is not None else None
        try:  # one attempt per request (botocore's documented setting), as after the last of several
            if denying is not None:
                moto_auth(s3_endpoint, denying)
            down = run(argv, tmp_path, AWS_ENDPOINT_URL=proxy.url if proxy else s3_endpoint, AWS_MAX_ATTEMPTS="1",
                       **extra, **(wrong if denying == 0 else {}))
        finally:
            if proxy is not None:
                proxy.close()
            if denying is not None:
                moto_auth(s3_endpoint, float("inf"))
        assert (proxy is None or proxy.errors > 0) and down.returncode == code, down.stderr[-3000:]
        lines = down.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in down.stderr, down.stderr[-3000:]
        assert lines[0].startswith(f"error: {said}"), lines
        if proxy is not None and code == 1:
            assert f"({cache}, {out})" in lines[0] and "503 SlowDown" in lines[0], lines
            assert "the same command continues" in lines[0] and "AWS_MAX_ATTEMPTS" in lines[0], lines
        if denying is not None:
            assert "AWS_PROFILE" in lines[0] and "AWS_ACCESS_KEY_ID" in lines[0], lines
            assert wrong["AWS_SECRET_ACCESS_KEY"] not in down.stderr and "testing" not in down.stderr
        if denying:  # moto's code, or a bare 403 where the refused request was a HEAD (its answer has no body)
            assert "(403 InvalidAccessKeyId)" in lines[0] or "(403)" in lines[0], lines
            assert "finished work is kept, so the same command continues once access is fixed" in lines[0], lines
    again = run(argv, tmp_path, AWS_ENDPOINT_URL=s3_endpoint, **extra)
    assert again.returncode == 0, again.stderr[-3000:]
    local = run([*eval_argv(tmp_path / "ref"), "--limit", "32"], tmp_path / "ref")
    assert local.returncode == 0, local.stderr[-3000:]
    from clipcache.storage.paths import as_path

    found = {p.name: json.loads(p.read_text())["metrics"]
             for p in as_path(f"{out}/tiny-shapes-clip").iterdir() if p.name.endswith(".json")}
    assert found and found == results(tmp_path / "ref" / "out")
    store = EmbeddingStore(cache)
    assert store.partial_keys() == [] and all(store.verify(k) == [] for k in store.keys())


def _client_error(status: int, code: str, operation: str = "PutObject"):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": f"{code} message"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


@pytest.mark.parametrize(("status", "code", "expected_errno"), [
    (503, "SlowDown", errno.EBUSY), (503, "ServiceUnavailable", errno.EBUSY), (503, "503", errno.EBUSY),
    (500, "InternalError", errno.EREMOTEIO), (500, "500", errno.EREMOTEIO), (409, "OperationAborted", errno.EBUSY),
    (400, "RequestTimeout", None), (429, "TooManyRequests", errno.EIO), (502, "BadGateway", errno.EIO)])
def test_a_store_failure_as_s3fs_raises_it_is_one_line(status, code, expected_errno):
    """Through s3fs's own translation (the OSError the CLI meets, its botocore error as the cause)."""
    from s3fs.errors import translate_boto_error

    error = translate_boto_error(_client_error(status, code, "HeadObject"))
    assert isinstance(error, OSError) and (expected_errno is None or error.errno == expected_errno)
    line = store_problem(error, ["s3://b/cache"])
    assert line is not None and line.startswith("the object store (s3://b/cache) answered ")
    assert f"{status}" in line and "HeadObject" in line and "the same command continues" in line


def test_an_unreachable_store_is_one_line_naming_the_endpoint():
    import aiohttp
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

    line = store_problem(EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b"))
    assert line is not None and "could not be reached at http://127.0.0.1:9/b" in line
    assert store_problem(ConnectTimeoutError(endpoint_url="http://127.0.0.1:9/b")) is not None
    wrapped = OSError(errno.EIO, "wrapped")
    wrapped.__cause__ = aiohttp.ServerDisconnectedError()
    assert store_problem(wrapped) is not None


@pytest.mark.parametrize("error", [
    OSError(errno.EBUSY, "Device or resource busy"),  # a local EBUSY: no store behind it
    FileNotFoundError("no such key"), ValueError("a bug"), KeyError("x")])
def test_errors_that_are_not_a_store_failure_are_left_alone(error):
    assert store_problem(error) is None


@pytest.mark.parametrize(("status", "code", "operation"), [
    (403, "AccessDenied", "PutObject"), (403, "403", "HeadObject"), (403, "InvalidAccessKeyId", "GetObject"),
    (403, "SignatureDoesNotMatch", "ListObjectsV2"), (400, "ExpiredToken", "PutObject"),
    (400, "InvalidToken", "GetObject"), (403, "RequestTimeTooSkewed", "PutObject")])
def test_a_denied_request_is_one_line_naming_the_credentials_to_check(status, code, operation):
    """Through s3fs's own translation (a ``PermissionError`` without errno, or an ``OSError``, botocore's error as
    the cause); only the status, code and operation are printed, never the store's message."""
    from s3fs.errors import translate_boto_error

    error = translate_boto_error(_client_error(status, code, operation))
    line = store_problem(error, ["s3://b/cache", "s3://b/results"])
    assert line is not None and line.startswith(f"the object store (s3://b/cache, s3://b/results) denied {operation} "
                                                f"({status}{'' if code == str(status) else ' ' + code}): ")
    assert f"{code} message" not in line and "the same command continues once access is fixed" in line
    if code == "RequestTimeTooSkewed":
        assert "clock" in line and "AWS_PROFILE" not in line
    else:
        assert "AWS_ACCESS_KEY_ID" in line and "AWS_PROFILE" in line and "list, read and write" in line


@pytest.mark.parametrize(("status", "code"), [(404, "NoSuchKey"), (404, "404"), (400, "InvalidArgument"),
                                              (403, "InvalidObjectState")])
def test_a_store_answer_about_the_request_is_left_alone(status, code):
    """A missing key (the code that reads asks ``exists`` first, or treats it as absent) and an archived object are
    not worded as a store failure or a denial."""
    from s3fs.errors import translate_boto_error

    assert store_problem(translate_boto_error(_client_error(status, code))) is None
    context = RuntimeError("a bug while handling it")
    context.__context__ = _client_error(503, "SlowDown")  # only explicit causes count, not an error being handled
    assert store_problem(context) is None
