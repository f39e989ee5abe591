"""The one reader of ``--config`` files, for every command: the files a command line names (``--config FILE`` or
``--config=FILE``, repeatable: merged in order, later files win), each a YAML mapping of option names (a flag without
its dashes, ``-`` or ``_`` alike) to values; the command line overrides them. ``train``, ``dpo``, ``grpo`` and ``kto``
also take the name of a recipe shipped in ``trainer/recipes/`` and a recipe's ``env:`` mapping (environment
variables the run sets)."""

from __future__ import annotations


def pop_config_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split ``argv`` into the rest and the ``--config`` values, in order. A ``--config`` with no value is a
    ``ValueError``."""
    rest, configs, i = [], [], 0
    while i < len(argv):
        if argv[i] == "--config":
            if i + 1 >= len(argv):
                raise ValueError("--config needs a file")
            configs.append(argv[i + 1])
            i += 2
        elif argv[i].startswith("--config="):
            configs.append(argv[i].split("=", 1)[1])
            i += 1
        else:
            rest.append(argv[i])
            i += 1
    return rest, configs


def read_config_files(paths: list[str], environment: bool = False) -> tuple[dict, dict[str, str]]:
    """The files' values merged in order (later files win) and, with ``environment``, their ``env:`` keys (for TRL's
    commands, as TRL's own ``--config`` reads them; otherwise ``env`` is a key like any other). Raises ``ValueError``
    naming the file that cannot be read or is not a mapping."""
    import yaml

    merged, env_values = {}, {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                config = yaml.safe_load(handle) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ValueError(f"--config {path}: {type(error).__name__}: {error}".splitlines()[0]) from error
        if not isinstance(config, dict):
            raise ValueError(f"--config {path}: a mapping of option names to values is expected")  # noqa: TRY004
        if environment:
            env = config.pop("env", None) or {}
            if not isinstance(env, dict):
                raise ValueError(f"--config {path}: 'env' must be a mapping of environment variable names to values")  # noqa: TRY004
            env_values.update({str(key): str(value) for key, value in env.items()})
        merged.update(config)
    return merged, env_values


__all__ = ["pop_config_flags", "read_config_files"]
