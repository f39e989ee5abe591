"""The one parser class of every command, ``CommandParser``: ``argparse`` with one-line usage errors, no abbreviated
flags and ``--config`` files. ``train``, ``dpo``, ``grpo`` and ``kto`` build theirs as this class and TRL's
``TrlParser`` at once (``class TrainParser(CommandParser, TrlParser)``), so their dataclasses' fields are the flags and
everything else is alike."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable

from llava_normaligned.compat import parser_actions

from .config_files import pop_config_flags, read_config_files
from .held_output import end_hold


class CommandParser(argparse.ArgumentParser):
    """The parser of a command.

    - argparse's own usage errors (an unknown flag, a value that is not a number, a missing argument) are one line,
      ``PROG: error: MESSAGE`` and the hint to ``--help``, exit code 2, as every other bad input (``fail``); the usage
      block is left to ``--help``;
    - a flag is only ever its whole name: argparse's abbreviations (``allow_abbrev``) are off, whatever the caller
      passes, so a typo that is a prefix of a flag (``--max_step 2`` for ``--max_steps``) is an unknown flag, not
      that flag (argparse still reads ``-xy`` as the single-dash flags ``-x -y``);
    - ``--config FILE.yaml`` (``config_files``: repeatable, later files win): a YAML mapping of the command's options
      (a key is the option's name or one of its flags without the dashes, ``-`` or ``_`` alike: ``max-new-tokens`` or
      ``max_new_tokens``; ``_use_config`` says how values read), read as the defaults, which the command line
      overrides. A key that is no option of the command, a value it does not take, or a positional argument, is a
      usage error naming the file.

    ``resolve_config`` turns a ``--config`` value into a file (``train``'s shipped recipes); ``config_environment``:
    a file's ``env:`` mapping holds environment variables for the run to set (TRL's commands), not an option. What the
    files gave is kept after parsing: ``config_files``, ``config_keys``, ``config_env``.
    """

    def __init__(self, *args, config_class: type | None = None, resolve_config: Callable[[str], str] | None = None,
                 config_environment: bool = False, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.config_class = config_class
        self.resolve_config = resolve_config
        self.config_environment = config_environment
        self.config_files: tuple[str, ...] = ()
        self.config_keys: tuple[str, ...] = ()
        self.config_env: dict[str, str] = {}
        shipped = ", or the name of a recipe shipped in trainer/recipes/" if resolve_config is not None else ""
        environment = "; its env: mapping sets environment variables" if config_environment else ""
        self.add_argument("--config", metavar="FILE.yaml", default=None,
                          help=f"a YAML file of this command's options (flag names without the dashes){shipped}, read "
                          f"before the command line, which overrides it; repeatable, later files win{environment} "
                          "(default: none)")
        if config_class is not None:
            self._add_options(config_class)

    def _add_options(self, config_class: type) -> None:
        """Each field of ``config_class`` made by ``option`` becomes its argument: the class's own fields first, in
        their order, then those it inherits (a shared group such as ``flags.NormOptions``), as ``--help`` lists them."""
        groups, exclusive = {}, {}
        inherited = {f.name for base in config_class.__mro__[1:] if dataclasses.is_dataclass(base)
                     for f in dataclasses.fields(base)}
        own = set(config_class.__dict__.get("__annotations__", {})) - inherited  # a redefined field keeps its place
        fields = dataclasses.fields(config_class)
        for field in [f for f in fields if f.name in own] + [f for f in fields if f.name not in own]:
            flags, kwargs, group, one_of, also = field.metadata[_OPTION]
            if group is not None and group not in groups:
                groups[group] = self.add_argument_group(group)
            where = self if group is None else groups[group]
            if one_of is not None:
                if (group, one_of) not in exclusive:
                    exclusive[(group, one_of)] = where.add_mutually_exclusive_group()
                where = exclusive[(group, one_of)]
            kwargs = dict(kwargs)
            if field.default is not dataclasses.MISSING:
                kwargs.setdefault("default", field.default)
            elif field.default_factory is not dataclasses.MISSING:
                kwargs.setdefault("default", field.default_factory())
            if flags:
                where.add_argument(*flags, dest=field.name, **kwargs)
            else:  # a positional argument, named by the field
                where.add_argument(field.name, **kwargs)
            for more_flags, more in also:
                where.add_argument(*more_flags, dest=field.name, **more)

    def parse_config(self, args=None):
        """Parse into the command's config: a ``config_class`` instance, built once and then only read (frozen)."""
        if self.config_class is None:
            raise TypeError(f"{self.prog}: parse_config needs the parser built with CommandParser(config_class=...)")
        namespace = self.parse_args(args)
        return self.config_class(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(self.config_class)
                                    if f.init})

    def error(self, message: str):
        end_hold(keep=False)
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)

    def parse_known_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        try:
            argv, paths = pop_config_flags(argv)
        except ValueError as error:
            self.error(str(error))
        keys, environment = set(), {}
        for path in paths:  # in order: a later file's value wins
            try:
                path = self.resolve_config(path) if self.resolve_config is not None else path
                values, env = read_config_files([path], environment=self.config_environment)
            except (OSError, ValueError) as error:
                self.error(str(error))
            keys |= self._use_config(path, values)
            environment.update(env)
        if paths:
            self.config_files, self.config_keys, self.config_env = tuple(paths), tuple(sorted(keys)), environment
        return super().parse_known_args(argv, namespace)

    def _use_config(self, path: str, values: dict) -> set[str]:
        """A file's values as the defaults of the options they name; returns the names of the values set (dests).

        A key is an option's name (its dest, the field: ``gradient_compensation: false``) or one of its flags without
        the dashes (``no-gradient-compensation: true``: true is the flag given, false the flag not given). The value
        is what the command line would give: typed as the option's ``type``, one of its ``choices``, a list for a
        repeatable option (a single value is a list of one), true or false for an on/off option; null leaves it
        unset (None). It becomes the default of every action of that dest (``--X`` and ``--no-X`` alike)."""
        by_dest, by_flag = {}, {}
        for action in parser_actions(self):
            if action.option_strings and action.dest not in ("help", "config"):
                by_dest.setdefault(action.dest, []).append(action)
                for flag in action.option_strings:
                    by_flag.setdefault(flag.lstrip("-").replace("-", "_"), action)
        named = set()
        for key, value in values.items():
            name = str(key).replace("-", "_")
            if name in by_dest:
                actions = by_dest[name]
                value = self._dest_value(path, key, actions, value)
            elif name in by_flag:
                action = by_flag[name]
                actions = by_dest[action.dest]
                if action.nargs == 0:  # a switch: true is the flag given; false leaves it as it is
                    if not isinstance(value, bool):
                        self.error(f"--config {path}: {key}: true or false is expected, not {value!r}")
                    if not value:
                        continue
                    value = action.const
                else:
                    value = self._typed(path, key, action, value)
            else:
                self.error(f"--config {path}: {key!r} is no option of {self.prog}")
            for action in actions:
                action.default, action.required = value, False
            named.add(actions[0].dest)
        return named

    def _dest_value(self, path: str, key: str, actions: list, value):
        """A value given by the option's name: through its first action that takes a value, else (only switches:
        ``--quick``, ``--load-in-4bit``/``--load-in-8bit``) true or false for on/off switches, or one of the values
        the switches set."""
        valued = [action for action in actions if action.nargs != 0]
        if valued:
            return self._typed(path, key, valued[0], value)
        consts = [action.const for action in actions]
        if all(isinstance(const, bool) for const in consts):
            if not isinstance(value, bool):
                self.error(f"--config {path}: {key}: true or false is expected, not {value!r}")
            return value
        if value is not None and value not in consts:
            self.error(f"--config {path}: {key}: {value!r} is not one of {', '.join(map(str, consts))}")
        return value

    def _typed(self, path: str, key: str, action, value):
        if value is None:  # YAML's null: unset
            return None
        many = action.nargs in ("+", "*") or isinstance(action.default, list)
        items = (value if isinstance(value, list) else [value]) if many else [value]
        typed = []
        for item in items:
            if isinstance(item, str) and action.type is not None:
                try:
                    item = action.type(item)
                except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
                    self.error(f"--config {path}: {key}: {error}")
            if action.choices is not None and item not in action.choices:
                self.error(f"--config {path}: {key}: {item!r} is not one of {', '.join(map(str, action.choices))}")
            typed.append(item)
        return typed if many else typed[0]


_OPTION = "llava_normaligned.option"


def option(*flags: str, default=dataclasses.MISSING, factory: Callable[[], object] | None = None,
           group: str | None = None, one_of: str | None = None, also: tuple = (), **kwargs):
    """A field of a command's config dataclass that is its command-line argument: ``flags`` (none: a positional
    argument named as the field) and ``kwargs`` are ``argparse.add_argument``'s, the field's default is the
    argument's (``factory`` for a list). ``group``: its section of ``--help``; ``one_of``: the name of a set of
    options of which only one may be given; ``also``: ``(flags, kwargs)`` pairs of further options that set the same
    field (``--no-trust-remote-code`` beside ``--trust-remote-code``)."""
    metadata = {_OPTION: (flags, kwargs, group, one_of, tuple(also))}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


__all__ = ["CommandParser", "option"]
