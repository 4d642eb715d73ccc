"""Static checks of the multi-node docker setup in docker/.

No Docker engine runs where this suite runs, so nothing here starts a container. Instead these tests check
what a reviewer would check by reading the files: one KRaft quorum whose voters agree, listeners a client can
reach, the durability settings, every container running a command that really exists (the sotw commands'
flags are parsed by the real CLI), the Spark and Locust topologies, volumes, health-gated start order,
resource limits, the Dockerfile, and that Spark's Kafka connector matches the PySpark that is installed.
"""

from __future__ import annotations

import base64
import http.server
import importlib.util
import json
import re
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sotw.cli import COMMANDS
from sotw.cli import main as sotw_main

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE: dict[str, Any] = yaml.safe_load((DOCKER / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (DOCKER / "Dockerfile").read_text()

_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(text: str) -> str:
    """Resolve ``${VAR:-default}`` as compose does with VAR unset (the defaults are what we ship)."""
    return _VAR.sub(lambda m: m.group(2) or "", text)


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command", [])
    words = shlex.split(cmd) if isinstance(cmd, str) else [str(w) for w in cmd]
    return [interpolate(w) for w in words]


def flag(cmd: list[str], name: str) -> str:
    assert name in cmd, f"{name} missing from {cmd}"
    return cmd[cmd.index(name) + 1]


def flags(cmd: list[str], name: str) -> list[str]:
    return [cmd[i + 1] for i, word in enumerate(cmd) if word == name]


def env(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment", {})
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {k: interpolate(str(v)) for k, v in raw.items()}


def uses_sotw_image(service: dict[str, Any]) -> bool:
    build = service.get("build") or {}
    return interpolate(service.get("image", "")).startswith("sotw:") or build.get("dockerfile") == (
        "docker/Dockerfile"
    )


def replicas(service: dict[str, Any]) -> int:
    return int(service.get("deploy", {}).get("replicas", 1))


KAFKA = {name: s for name, s in SERVICES.items() if "apache/kafka" in interpolate(s.get("image", ""))}
SOTW = {name: s for name, s in SERVICES.items() if uses_sotw_image(s)}
SOTW_COMMANDS = {name: s for name, s in SOTW.items() if command(s)[:1] == ["sotw"]}


def by_program(program: str) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in SOTW.items() if command(s)[:1] == [program]}


def listeners(text: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}."""
    out = {}
    for item in text.split(","):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        out[name] = (host, int(port))
    return out


def published(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port, from ``ports: ["HOST:CONTAINER"]``."""
    out = {}
    for spec in service.get("ports", []):
        host, _, container = str(spec).rpartition(":")
        out[int(container)] = int(host)
    return out


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source for short-syntax volumes."""
    out = {}
    for spec in service.get("volumes", []):
        source, target = str(spec).split(":")[:2]
        out[target] = source
    return out


# --- Kafka -----------------------------------------------------------------------------------------------------


def test_kafka_is_three_nodes_in_one_kraft_quorum_whose_voters_agree() -> None:
    assert len(KAFKA) == 3, sorted(KAFKA)
    envs = {name: env(s) for name, s in KAFKA.items()}
    node_ids = {int(e["KAFKA_NODE_ID"]) for e in envs.values()}
    assert len(node_ids) == 3, "node ids must be unique"
    voters_strings = {e["KAFKA_CONTROLLER_QUORUM_VOTERS"] for e in envs.values()}
    assert len(voters_strings) == 1, f"controller.quorum.voters differ between nodes: {voters_strings}"
    cluster_ids = {e["CLUSTER_ID"] for e in envs.values()}
    assert len(cluster_ids) == 1, f"nodes would format different clusters: {cluster_ids}"
    assert len(base64.urlsafe_b64decode(cluster_ids.pop() + "==")) == 16, "CLUSTER_ID must be a base64 UUID"

    voters = {}
    for voter in voters_strings.pop().split(","):
        node, _, address = voter.partition("@")
        host, _, port = address.rpartition(":")
        voters[int(node)] = (host, int(port))
    controllers = {}
    for name, e in envs.items():
        roles = set(e["KAFKA_PROCESS_ROLES"].split(","))
        assert roles <= {"broker", "controller"} and roles
        if "controller" in roles:
            controller_listener = e["KAFKA_CONTROLLER_LISTENER_NAMES"]
            controllers[int(e["KAFKA_NODE_ID"])] = (
                KAFKA[name].get("hostname", name),
                listeners(e["KAFKA_LISTENERS"])[controller_listener][1],
            )
    assert voters == controllers, "every voter must be a controller node at its CONTROLLER listener"
    assert len(voters) in (3, 5), "a quorum needs an odd number of voters to survive a node loss"


def test_kafka_advertises_an_internal_and_a_host_listener_per_broker() -> None:
    for name, service in KAFKA.items():
        e = env(service)
        bound = listeners(e["KAFKA_LISTENERS"])
        advertised = listeners(e["KAFKA_ADVERTISED_LISTENERS"])
        protocols = dict(item.split(":") for item in e["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
        assert set(bound) <= set(protocols), f"{name}: listener without a security protocol"
        assert e["KAFKA_CONTROLLER_LISTENER_NAMES"] not in advertised, (
            f"{name}: controllers are not advertised"
        )
        internal = e["KAFKA_INTER_BROKER_LISTENER_NAME"]
        assert advertised[internal] == (service.get("hostname", name), bound[internal][1])
        ports = published(service)
        for listener, (host, port) in advertised.items():
            assert listener in bound, f"{name}: advertised {listener} is not bound"
            if host == "localhost":
                assert ports.get(bound[listener][1]) == port, (
                    f"{name}: {listener} must be published on {port}"
                )
    host_ports = [p for s in KAFKA.values() for p in published(s).values()]
    assert len(host_ports) == len(set(host_ports)), "brokers must publish different host ports"


def test_kafka_replicates_three_ways_and_acknowledges_only_with_two_in_sync() -> None:
    for name, service in KAFKA.items():
        e = env(service)
        assert e["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3", name
        assert e["KAFKA_MIN_INSYNC_REPLICAS"] == "2", name
        assert e["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3", name
        assert e["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3", name
        assert e["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2", name
        assert "/var/lib/kafka/data" in mounts(service), f"{name}: broker data must live on a volume"


def test_sotw_services_default_to_the_bundled_brokers_internal_listeners() -> None:
    internal = {
        ":".join(map(str, listeners(env(s)["KAFKA_ADVERTISED_LISTENERS"])["PLAINTEXT"]))
        for s in KAFKA.values()
    }
    kafka_users = {**SOTW_COMMANDS, **by_program("locust")}
    assert kafka_users
    for name, service in kafka_users.items():
        bootstrap = flag(command(service), "--bootstrap")
        assert set(bootstrap.split(",")) == internal, f"{name}: --bootstrap {bootstrap}"
        assert "${SOTW_BOOTSTRAP:-" in str(service["command"]), f"{name}: SOTW_BOOTSTRAP must override it"
        depends = set(service.get("depends_on", {}))
        assert set(KAFKA) <= depends or "locust-master" in depends, f"{name} must wait for the brokers"


# --- what the sotw containers run --------------------------------------------------------------------------------


def test_every_sotw_image_service_runs_a_real_entry_point() -> None:
    assert SOTW
    for name, service in SOTW.items():
        cmd = command(service)
        if cmd[0] == "sotw":
            assert cmd[1] in COMMANDS, f"{name}: `sotw {cmd[1]}` is not a sotw command"
            if "--kafka-config" in cmd:
                assert "/etc/sotw/kafka.properties" in mounts(service), f"{name}: --kafka-config not mounted"
        elif cmd[0] == "spark-class":
            assert cmd[1] in (
                "org.apache.spark.deploy.master.Master",
                "org.apache.spark.deploy.worker.Worker",
            )
        elif cmd[0] == "locust":
            locustfile = flag(cmd, "-f")
            assert locustfile.startswith("/app/"), "the image keeps the source tree in /app"
            assert (ROOT / Path(locustfile).relative_to("/app")).is_file(), locustfile
        else:
            pytest.fail(f"{name} runs {cmd[0]!r}, which is neither sotw, spark-class nor locust")


@pytest.mark.parametrize("service_name", sorted(SOTW_COMMANDS))
def test_sotw_command_flags_are_accepted_by_the_real_cli(
    service_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cmd = command(SERVICES[service_name])
    module = COMMANDS[cmd[1]][0]
    if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not written yet")
    # --help last: argparse checks every earlier value (choices, types) before it prints help and exits 0;
    # unknown flags are only reported after --help, so they are checked against the help text instead.
    with pytest.raises(SystemExit) as exit_info:
        sotw_main([*cmd[1:], "--help"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 0, f"`{shlex.join(cmd)}` rejected: {err}"
    known = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", out))
    used = {word.split("=")[0] for word in cmd[2:] if word.startswith("-")}
    assert used <= known, f"{service_name}: flags unknown to `sotw {cmd[1]}`: {sorted(used - known)}"


# --- Spark --------------------------------------------------------------------------------------------------------


def spark_daemons(cls: str) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in by_program("spark-class").items() if command(s)[1].endswith(cls)}


def test_spark_standalone_has_one_master_and_at_least_two_workers_joined_to_it() -> None:
    masters = spark_daemons(".Master")
    workers = spark_daemons(".Worker")
    assert len(masters) == 1
    [(master_name, master)] = masters.items()
    cmd = command(master)
    assert flag(cmd, "--host") == master.get("hostname", master_name)
    url = f"spark://{flag(cmd, '--host')}:{flag(cmd, '--port')}"
    assert sum(replicas(w) for w in workers.values()) >= 2
    for name, worker in workers.items():
        assert command(worker)[-1] == url, f"{name} must join {url}"
        assert worker["depends_on"][master_name]["condition"] == "service_healthy"
        assert int(flag(command(worker), "--cores")) >= 1
        assert re.fullmatch(r"\d+[mg]", flag(command(worker), "--memory"))
    pipelines = {n: s for n, s in SOTW_COMMANDS.items() if command(s)[1] == "pipeline"}
    assert pipelines
    for name, service in pipelines.items():
        assert flag(command(service), "--master") == url, f"{name} must drive the standalone cluster"


def test_pipeline_reads_with_sparks_kafka_connector_and_keeps_state_on_volumes_the_workers_share() -> None:
    service = SERVICES["pipeline"]
    cmd = command(service)
    assert flag(cmd, "--source") == "spark-kafka"
    assert flag(cmd, "--policy") in ("strict", "ordered", "once", "window", "none")
    conf = dict(item.split("=", 1) for item in flags(cmd, "--conf"))
    assert conf["spark.driver.host"] == service["hostname"], "executors connect back to the driver by name"
    checkpoint, output = Path(flag(cmd, "--checkpoint")), Path(flag(cmd, "--output"))
    assert checkpoint != output
    driver_mounts = mounts(service)
    for worker in spark_daemons(".Worker").values():
        worker_mounts = mounts(worker)
        for path in (checkpoint, output):
            shared = [
                t for t in driver_mounts if path.is_relative_to(t) and driver_mounts[t] in COMPOSE["volumes"]
            ]
            assert shared, f"{path} is not on a named volume of the driver"
            assert all(worker_mounts.get(t) == driver_mounts[t] for t in shared), (
                f"{path} must be on the same volume, at the same path, on every worker"
            )
    waits = {k for k, v in service["depends_on"].items() if v["condition"] == "service_healthy"}
    assert set(KAFKA) | set(spark_daemons("")) <= waits


# --- Locust -------------------------------------------------------------------------------------------------------


def test_locust_master_serves_the_web_ui_on_8089_and_workers_connect_to_it() -> None:
    locust = by_program("locust")
    masters = {n: s for n, s in locust.items() if "--master" in command(s)}
    workers = {n: s for n, s in locust.items() if "--worker" in command(s)}
    assert len(masters) == 1 and workers
    [(master_name, master)] = masters.items()
    web_port = int(flag(command(master), "--web-port")) if "--web-port" in command(master) else 8089
    assert web_port == 8089 and published(master)[8089] == 8089
    for name, worker in workers.items():
        cmd = command(worker)
        assert flag(cmd, "--master-host") == master_name, name
        assert flag(cmd, "-f") == flag(command(master), "-f"), (
            "master and workers must load the same locustfile"
        )
        assert replicas(worker) >= 1
        assert worker["depends_on"][master_name]["condition"] == "service_healthy"
        # The master verifies the union of the workers' ledgers, written under its --run-dir.
        run_dir = flag(command(master), "--run-dir")
        shared = [v.split(":")[1] for v in worker.get("volumes", []) if v.split(":")[0] in ("runs",)]
        assert any(run_dir.startswith(mount) for mount in shared), f"{name} must mount the master's {run_dir}"


@pytest.mark.parametrize("service_name", sorted(by_program("locust")))
def test_locust_services_flags_are_accepted_by_locusts_parser_with_the_real_locustfile(
    service_name: str,
) -> None:
    # `--list` makes Locust import the locustfile, parse the whole command line with the locustfile's options
    # and list its users, without starting anything.
    cmd = command(SERVICES[service_name])
    locustfile = ROOT / Path(flag(cmd, "-f")).relative_to("/app")
    args = [str(locustfile) if word == flag(cmd, "-f") else word for word in cmd[1:]]
    done = subprocess.run(
        [sys.executable, "-m", "locust", *args, "--list"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, f"{service_name}: {done.stderr[-2000:]}"
    assert "SensorLoad" in done.stdout


def test_sotw_locust_help_lists_the_locustfiles_options() -> None:
    # Locust's own `--help` prints before it imports a locustfile (upstream issue 2917), so the locustfile's
    # options are listed by `sotw locust --help`, which loads it into Locust's parser first.
    done = subprocess.run(
        [sys.executable, "-m", "sotw", "locust", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for option in ("--bootstrap", "--kafka-config", "--sotw-profile", "--policy", "--shape", "--load",
                   "--users-per-x", "--no-pipeline", "--check-lag-age", "--check-e2e-p99", "--check-correct"):  # fmt: skip
        assert option in done.stdout, option


# --- volumes, start order, limits ---------------------------------------------------------------------------------


def test_every_volume_a_service_mounts_exists_and_every_declared_volume_is_used() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    used = set()
    for name, service in SERVICES.items():
        for target, source in mounts(service).items():
            assert target.startswith("/"), f"{name}: {target}"
            if source.startswith((".", "/")):
                assert (DOCKER / source).resolve().exists(), f"{name}: bind mount {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
                used.add(source)
    assert used == declared, f"declared but unused: {declared - used}"


def test_start_order_waits_only_on_services_that_can_report_health() -> None:
    for name, service in SERVICES.items():
        for dep, spec in service.get("depends_on", {}).items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[dep], (
                    f"{name} waits for {dep} to be healthy; it has no check"
                )
    for name in [*KAFKA, *spark_daemons(""), "pipeline", "locust-master"]:
        test = SERVICES[name]["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL"), name
        if "sotw-healthcheck" in test:
            assert uses_sotw_image(SERVICES[name]), f"{name}: sotw-healthcheck is only in the sotw image"


def test_every_service_has_cpu_and_memory_limits() -> None:
    for name, service in SERVICES.items():
        limits = service.get("deploy", {}).get("resources", {}).get("limits", {})
        assert float(limits["cpus"]) > 0, name
        assert re.fullmatch(r"\d+[KMG]", str(limits["memory"])), (
            f"{name}: memory limit {limits.get('memory')}"
        )


# --- the image ----------------------------------------------------------------------------------------------------


def test_dockerfile_builds_python_311_with_java_17_and_installs_the_project() -> None:
    assert re.search(r"^FROM python:3\.11-slim", DOCKERFILE, re.M)
    assert "openjdk-17-jre-headless" in DOCKERFILE
    assert re.search(r"^ENV JAVA_HOME=", DOCKERFILE, re.M)
    assert re.search(r"^COPY \. /app$", DOCKERFILE, re.M), "the project source must be in the image"
    assert re.search(r"pip install\b[^\n]*\s\.\s", DOCKERFILE), "sotw must be installed with `pip install .`"
    assert re.search(r"^USER (?!root)\w+", DOCKERFILE, re.M), "containers should not run as root"
    assert re.search(r"^ENTRYPOINT \[\"/usr/bin/tini\"", DOCKERFILE, re.M)
    for source in re.findall(r"^COPY (?:--\S+ )*(docker/\S+)", DOCKERFILE, re.M):
        assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
    assert "/usr/local/bin/sotw-healthcheck" in DOCKERFILE
    for service in SOTW.values():
        assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".git"} <= set(ignored), "the build context must not carry the virtualenv or git history"


def test_the_image_fetches_the_kafka_connector_and_delta_for_exactly_its_pyspark() -> None:
    import pyspark

    # The image installs exactly the PySpark that make setup does, and fetches the same bundles of jars.
    pins = re.findall(r"^pyspark==(\S+)", (DOCKER / "constraints.txt").read_text(), re.M)
    assert pins == [pyspark.__version__], "the image must install exactly the PySpark the jars are built for"
    pom = (ROOT / "jars" / "spark-kafka" / "pom.xml").read_text()
    assert f"<spark.version>{pyspark.__version__}</spark.version>" in pom
    assert re.search(r"python -m sotw\.jars fetch spark-kafka delta", DOCKERFILE)
    # Nothing is resolved at run time: no Ivy coordinates in the image's Spark defaults.
    assert "spark.jars.packages" not in (DOCKER / "spark-defaults.conf").read_text()
    assert "SPARK_CONF_DIR=/etc/sotw/spark" in DOCKERFILE


# --- the health check script ---------------------------------------------------------------------------------------


def _load_healthcheck() -> Any:
    spec = importlib.util.spec_from_file_location("sotw_healthcheck", DOCKER / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def http_server() -> Iterator[str]:
    """A local HTTP server answering like a Spark master's /json/ (one running app) and 404 elsewhere."""
    body = json.dumps({"activeapps": [{"name": "sotw-pipeline", "state": "RUNNING"}], "workers": []}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/json/" else 404)
            self.end_headers()
            if self.path == "/json/":
                self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_healthcheck_reports_healthy_only_when_the_service_answers(http_server: str) -> None:
    check = _load_healthcheck().main
    assert check(["http", f"{http_server}/json/"]) == 0
    assert check(["http", f"{http_server}/missing"]) == 1
    assert check(["spark-app", f"{http_server}/json/", "sotw-pipeline"]) == 0
    assert check(["spark-app", f"{http_server}/json/", "another-app"]) == 1
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    assert check(["http", f"http://127.0.0.1:{closed}/json/"]) == 1
    assert check(["http", "file:///etc/passwd"]) == 1
    assert check(["bogus"]) == 2


# --- the harness ------------------------------------------------------------------------------------------------


def test_the_harness_service_runs_a_load_test_on_the_cluster_and_keeps_its_run_where_the_workers_see_it() -> (
    None
):
    from loadtest.run.profile import load_profile

    service = SERVICES["harness"]
    cmd = command(service)
    assert cmd[:2] == ["sotw", "run"]
    assert "harness" in service.get("profiles", []), "a run on demand, not a service `up` starts"
    scenario = mounts(service)[flag(cmd, "--scenario")]
    profile = load_profile(flag(cmd, "--profile"), (DOCKER / scenario).resolve())
    [(master_name, master)] = spark_daemons(".Master").items()
    assert (
        profile.pipeline.master
        == f"spark://{flag(command(master), '--host')}:{flag(command(master), '--port')}"
    )
    args = profile.pipeline.args()
    conf = dict(args[i + 1].split("=", 1) for i, word in enumerate(args) if word == "--conf")
    assert conf["spark.driver.host"] == service["hostname"], "executors connect back to the harness's driver"
    assert profile.pipeline.shuffle_partitions >= sum(
        int(flag(command(w), "--cores")) * replicas(w) for w in spark_daemons(".Worker").values()
    )
    # The run directory (ledger, the pipeline's checkpoint and output, the report) is under the working directory,
    # which must be the same volume at the same path on every worker that runs the pipeline's tasks.
    work = Path(service["working_dir"])
    volume = mounts(service)[str(work)]
    assert volume in COMPOSE["volumes"]
    for name, worker in spark_daemons(".Worker").items():
        assert mounts(worker).get(str(work)) == volume, f"{name} must mount {volume} at {work}"
    waits = {k for k, v in service["depends_on"].items() if v["condition"] == "service_healthy"}
    assert set(KAFKA) | set(spark_daemons("")) <= waits
