"""Deployments for real: a Prefect server on 127.0.0.1 (own PREFECT_HOME, SQLite), `prefect deploy` + a process
worker, `clipcache serve`, runs triggered through the REST API and runs produced by a cron schedule."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml

from conftest import REPO
from prefect_db_helpers import keep_database, seed_database

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path, api_url: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
                "PREFECT_LOGGING_LEVEL": "WARNING", "PREFECT_UI_ENABLED": "false", **extra})
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """`prefect server start` on 127.0.0.1 with its own SQLite database (a fresh one migrated at start, or the test
    run's already migrated one: tests/prefect_db_helpers.py); yields its API URL."""
    home = tmp_path_factory.mktemp("server-home")
    seeded = seed_database(home, tmp_path_factory)
    port = _free_port()
    log = open(home / "server.log", "w")
    server = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=_env(home, PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2"), stdout=log, stderr=subprocess.STDOUT,
        cwd=home)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert server.poll() is None, (home / "server.log").read_text()[-3000:]
        time.sleep(0.5)
    else:
        server.kill()
        pytest.fail("prefect server did not become healthy: " + (home / "server.log").read_text()[-3000:])
    if not seeded:
        keep_database(home, tmp_path_factory)
    yield url
    server.terminate()
    server.wait(timeout=30)
    log.close()


def _suite(tmp_path: Path, datasets: list[str]) -> Path:
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"models": [{"model_name": "tiny-shapes-clip"}], "datasets": datasets,
                                     "limit": 48, "cache_dir": str(tmp_path / "cache"),
                                     "output_dir": str(tmp_path / "out"), "verbose": False}))
    return suite


def _wait_for_run(api: str, run_id: str, timeout: float, procs: list[subprocess.Popen]) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = httpx.get(f"{api}/flow_runs/{run_id}", timeout=30).json()  # a loaded SQLite server answers slowly
        state = (run.get("state") or {}).get("type")
        if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run
        assert all(p.poll() is None for p in procs), "a worker/serve process exited early"
        time.sleep(1)
    pytest.fail(f"flow run {run_id} did not finish in {timeout} s (last state {state})")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _metric_rows(out: Path) -> dict[str, int]:
    from clipcache.storage.warehouse import connect

    con = connect(out)
    return dict(con.sql("SELECT dataset, count(*) FROM metrics GROUP BY dataset").fetchall())


def test_repo_prefect_yaml_declares_the_three_deployments():
    from clipcache.flows.orchestration.deployments import runner_deployments

    deployments = {d.name: d for d in runner_deployments(REPO / "prefect.yaml")}
    assert sorted(deployments) == ["convert", "nightly-evaluate", "report"]
    nightly = deployments["nightly-evaluate"]
    assert nightly.parameters == {"params": {"suite": "suites/nightly.yaml"}}
    assert [s.schedule.cron for s in nightly.schedules] == ["0 2 * * *"]
    # each flow has one validated parameter model, which is the deployment's parameter schema
    for d in deployments.values():
        assert list(d._parameter_openapi_schema.properties) == ["params"] and d.enforce_parameter_schema


def test_every_file_prefect_yaml_names_exists_and_the_suite_validates():
    import importlib.util

    from clipcache.flows.orchestration.deployments import load_suite, read_deployments

    named, modules = [], []
    for d in read_deployments(REPO / "prefect.yaml"):
        modules.append(d["entrypoint"].partition(":")[0])  # module paths: they load from the installed package
        params = (d.get("parameters") or {}).get("params") or {}
        named += [v for k, v in params.items() if k == "suite"]
    assert named and all((REPO / f).is_file() for f in named), [f for f in named if not (REPO / f).is_file()]
    assert all(m.startswith("clipcache.flows.") and importlib.util.find_spec(m) for m in modules), modules
    for d in read_deployments(REPO / "prefect.yaml"):
        suite = ((d.get("parameters") or {}).get("params") or {}).get("suite")
        if suite:
            assert load_suite(str(REPO / suite), {})  # every pair in it validates


def test_suite_errors_name_the_file_and_field(tmp_path):
    from clipcache.flows.orchestration.deployments import load_suite
    from clipcache.storage.errors import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [{model_name: m}]\ndatasets: [shapes]\nbatch_sise: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: batch_sise: unknown key"):
        load_suite(bad)
    good = load_suite(REPO / "suites" / "nightly.yaml", {"limit": 10})
    assert good.datasets == ["shapes", "shapes_retrieval"] and good.limit == 10


@pytest.mark.slow
def test_prefect_deploy_and_a_process_worker_run_a_triggered_evaluation(prefect_api, tmp_path):
    home = tmp_path / "client-home"
    env = _env(home, prefect_api, PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_WORKER_PREFETCH_SECONDS="1")
    run = subprocess.run
    # the pool `prefect work-pool create clipcache --type process` makes, made through the REST API it calls (one
    # Prefect CLI start-up less): a process pool with the process worker's default job template
    from prefect.workers.process import ProcessWorker

    pool = httpx.post(f"{prefect_api}/work_pools/", timeout=30, json={
        "name": "clipcache", "type": "process", "base_job_template": ProcessWorker.get_default_base_job_template()})
    assert pool.status_code == 201, pool.text
    deployed = run([str(BIN / "prefect"), "--no-prompt", "deploy", "--all"], env=env, cwd=REPO, capture_output=True,
                   text=True, timeout=300)
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]

    deployment = httpx.get(f"{prefect_api}/deployments/name/evaluate-suite/nightly-evaluate").json()
    assert [s["schedule"]["cron"] for s in deployment["schedules"]] == ["0 2 * * *"]
    assert deployment["work_pool_name"] == "clipcache"

    worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "clipcache", "--type", "process"],
                              env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        suite = _suite(tmp_path, ["shapes", "shapes_retrieval"])
        for _ in range(10):  # the SQLite-backed server answers 503 while its database is busy (a worker polling)
            created = httpx.post(f"{prefect_api}/deployments/{deployment['id']}/create_flow_run",
                                 json={"parameters": {"params": {"suite": str(suite)}}})
            if created.status_code != 503:
                break
            time.sleep(2)
        assert created.status_code == 201, created.text
        finished = _wait_for_run(prefect_api, created.json()["id"], 300, [worker])
    finally:
        _stop(worker)
    assert finished["state"]["type"] == "COMPLETED", finished["state"]
    assert _metric_rows(tmp_path / "out").keys() == {"shapes", "shapes_retrieval"}
    artifacts = httpx.post(f"{prefect_api}/artifacts/filter",
                           json={"artifacts": {"flow_run_id": {"any_": [finished["id"]]}}}).json()
    assert {"table", "markdown"} <= {a["type"] for a in artifacts}
    # `clipcache serve` of the same prefect.yaml refuses to take a deployed deployment from the pool's workers
    served = run([str(BIN / "clipcache"), "serve"], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert served.returncode == 2 and len(served.stderr.strip().splitlines()) == 1, served.stderr[-2000:]
    assert "evaluate-suite/nightly-evaluate (work pool 'clipcache')" in served.stderr
    assert "deployed to a work pool by `prefect deploy`" in served.stderr
    after = httpx.get(f"{prefect_api}/deployments/name/evaluate-suite/nightly-evaluate").json()
    assert after["work_pool_name"] == "clipcache" and after["pull_steps"] == deployment["pull_steps"]


@pytest.mark.slow
def test_clipcache_serve_turns_a_cron_schedule_into_runs(prefect_api, tmp_path):
    """A deployment served by `clipcache serve` with an every-minute cron: the server schedules runs, and the first
    one that comes due is executed by the serve process and writes results."""
    suite = _suite(tmp_path, ["shapes"])
    prefect_file = tmp_path / "prefect.yaml"
    prefect_file.write_text(yaml.safe_dump({"deployments": [{
        "name": "every-minute", "entrypoint": f"{REPO}/flows/orchestration/flows.py:evaluate_suite",
        "parameters": {"params": {"suite": str(suite)}}, "schedules": [{"cron": "* * * * *", "timezone": "UTC"}]}]}))
    env = _env(tmp_path / "client-home", prefect_api, PREFECT_RUNNER_POLL_FREQUENCY="1")
    serve = subprocess.Popen([str(BIN / "clipcache"), "serve", "--prefect_file", str(prefect_file)], env=env,
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, deployment = time.monotonic() + 120, None
        while deployment is None and time.monotonic() < deadline:
            response = httpx.get(f"{prefect_api}/deployments/name/evaluate-suite/every-minute", timeout=30)
            deployment = response.json() if response.status_code == 200 else None
            assert serve.poll() is None, "clipcache serve exited"
            time.sleep(1)
        assert deployment is not None, "clipcache serve did not register its deployment"

        def runs() -> list[dict]:
            return httpx.post(f"{prefect_api}/flow_runs/filter", json={
                "flow_runs": {"deployment_id": {"any_": [deployment["id"]]}}, "sort": "EXPECTED_START_TIME_ASC"},
                timeout=30).json()

        deadline = time.monotonic() + 60
        while not runs() and time.monotonic() < deadline:
            time.sleep(1)
        scheduled = runs()
        assert scheduled, "the cron schedule produced no flow runs"
        starts = [datetime.fromisoformat(r["expected_start_time"].replace("Z", "+00:00")) for r in scheduled]
        assert all(s.second == 0 and s.microsecond == 0 for s in starts)  # on minute boundaries, as cron says
        assert all(r["auto_scheduled"] for r in scheduled)
        # the first run comes due now rather than at its minute (up to 60 s of idle waiting): its Scheduled state's
        # time moved through the REST API, as `prefect flow-run` rescheduling does; serve must still find and run it
        first = scheduled[0]["id"]
        moved = httpx.post(f"{prefect_api}/flow_runs/{first}/set_state", json={"force": True, "state": {
            "type": "SCHEDULED", "name": "Scheduled",
            "state_details": {"scheduled_time": datetime.now(UTC).isoformat()}}}, timeout=30)
        assert moved.status_code in (200, 201) and moved.json()["status"] == "ACCEPT", moved.text
        finished = _wait_for_run(prefect_api, first, 180, [serve])
    finally:
        _stop(serve)
    assert finished["state"]["type"] == "COMPLETED", finished["state"]
    assert _metric_rows(tmp_path / "out").keys() == {"shapes"}


def test_serve_without_a_server_says_what_to_start(capsys):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from clipcache.flows.cli import main

    with temporary_settings(updates={PREFECT_API_URL: None}):
        assert main(["serve", "--prefect_file", str(REPO / "prefect.yaml")]) == 2
    err = capsys.readouterr().err
    assert "prefect server start" in err and "PREFECT_API_URL" in err
