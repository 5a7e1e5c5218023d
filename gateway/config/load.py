"""Loading the config: the YAML file, ``${VAR}`` references, the environment, the checks.

``load_settings`` is the only entry point a process uses. It reads the YAML
file, expands ``${VAR}`` references, lets ``HOARD_...`` environment variables
(nested with ``__``) override any key, validates everything strictly
(``settings.py``'s models: unknown keys are an error) and checks
cross-references (a mount naming an unknown origin). A bad config raises
``ConfigError``, one line per problem. A file that is not YAML is reported as
``file:line:column: problem``, as a compiler would, and a key given twice in
one mapping is an error there too: PyYAML would keep the last one silently,
so ``cache.size`` set twice would leave a reader of the file guessing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.config.settings import ConfigError, Settings

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (YAML forbids it)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    first_seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
            continue  # merges (<<) and complex keys: left to PyYAML's own rules
        key = loader.construct_object(key_node)
        if key in first_seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice (first on line {first_seen[key]})",
                key_node.start_mark,
            )  # fmt: skip
        first_seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def _expand(value: Any, path: str, environ: dict[str, str]) -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string of the YAML tree."""
    if isinstance(value, dict):
        return {k: _expand(v, f"{path}.{k}" if path else str(k), environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{path}.{i}", environ) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{path}: environment variable {name} is not set")

    return _VAR.sub(substitute, value)


def read_yaml(path: Path, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Read a config file into a plain dict with ``${VAR}`` references expanded."""
    try:
        # A SafeLoader: plain data only, no Python objects from tags.
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_problem(path, exc)) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    return _expand(raw, "", dict(os.environ if environ is None else environ))


def _yaml_problem(path: Path, exc: yaml.YAMLError) -> str:
    """``file:line:column: invalid YAML: problem`` (1-based, as editors count), one line.

    PyYAML's own text spreads over several lines with a snippet of the file; the
    mark and the problem are what a reader needs to find it.
    """
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:  # not a parse error (e.g. bytes that are not text)
        first_line = str(exc).splitlines()[0] if str(exc) else "unreadable"
        return f"{path}: invalid YAML: {first_line}"
    where = f"{path}:{mark.line + 1}:{mark.column + 1}"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start is not None and (start.line, start.column) != (mark.line, mark.column):
        problem += f" ({context} that starts at {start.line + 1}:{start.column + 1})"
    elif context:
        problem += f" ({context})"
    return f"{where}: invalid YAML: {problem}"


def _describe(error: dict[str, Any]) -> str:
    # Discriminated unions add the tag to the location ("origins.aws.s3.endpoint"); drop it.
    loc = [str(p) for p in error["loc"] if p not in ("s3", "posix") or p == error["loc"][0]]
    key = ".".join(loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        return f"{key}: unknown key"
    if error["type"] == "missing":
        return f"{key}: required key is missing"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{key}: {message}"


def _check_references(settings: Settings) -> list[str]:
    known = sorted(settings.origins)
    problems = []
    if settings.default_origin is not None and settings.default_origin not in settings.origins:
        problems.append(
            f"default_origin: unknown origin {settings.default_origin!r} (known: {known})"
        )
    if settings.default_origin is None and not settings.mounts:
        problems.append(
            "default_origin: nothing is served; add an origin and name it here "
            "(origins: {data: {type: posix, path: ./data}} with default_origin: data), "
            "or add mounts"
        )
    seen: set[str] = set()
    for index, mount in enumerate(settings.mounts):
        if mount.origin not in settings.origins:
            problems.append(
                f"mounts.{index}.origin: unknown origin {mount.origin!r} (known: {known})"
            )
        if mount.bucket in seen:
            problems.append(f"mounts.{index}.bucket: bucket {mount.bucket!r} is mounted twice")
        seen.add(mount.bucket)
    cluster = settings.cluster
    if cluster.enabled and (cluster.secret is None or not cluster.secret.get_secret_value()):
        problems.append("cluster.secret: a cluster (cluster.self with peers or dns) needs a secret")
    access_keys = [c.access_key for c in settings.credentials]
    if len(set(access_keys)) != len(access_keys):
        problems.append("credentials: an access_key appears twice")
    return problems


def build_settings(data: dict[str, Any]) -> Settings:
    """Validate a config mapping (environment overrides applied); raise ``ConfigError``."""
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(e) for e in exc.errors())) from None
    problems = _check_references(settings)
    if problems:
        raise ConfigError("\n".join(problems))
    return settings


def load_settings(path: Path | None, defaults: dict[str, Any] | None = None) -> Settings:
    """Load the YAML file at ``path`` (or only ``defaults`` without one) plus the environment."""
    data = dict(defaults or {})
    if path is not None:
        data.update(read_yaml(path))
    return build_settings(data)
