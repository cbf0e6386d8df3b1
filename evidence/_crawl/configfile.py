"""A TOML file of the crawl's options (``crawl --config``), and the effective options
written back as one (``--print-config``).

A key is a long flag's name with underscores (``--max-documents``: ``max_documents``),
its value converted and checked as the flag's own would be; the command line wins over
the file (``_cli.common.note_given`` marks what it gave). It reads the command's parser, so a new
flag is a key at once. It is separate from the command-line layer (``_cli``) because it
is the crawl's configuration, not the command's form: the seeds, ``[[hosts]]`` and
``[[proxies]]`` tables the same file holds are read by ``_crawl.arguments``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import msgspec

__all__ = ["ConfigError", "apply_config", "config_keys", "config_toml"]

# Options a configuration file cannot set: what reads the file, and what only a person at
# the command line should say.
_NOT_CONFIGURABLE = {"help", "config", "print_config", "yes"}


def config_keys(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Each option a configuration file may set, under its long flag's name with
    underscores (``--max-documents``: ``max_documents``)."""
    keys = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if longs and action.dest not in _NOT_CONFIGURABLE:
            keys[longs[0][2:].replace("-", "_")] = action
    return keys


class ConfigError(Exception):
    """A configuration file that cannot be used (raised as an EvidenceError by callers)."""


def _line_of(text: str, key: str) -> int | None:
    found = re.search(rf"(?m)^\s*[\"']?{re.escape(key)}[\"']?\s*=", text)
    return None if found is None else text.count("\n", 0, found.start()) + 1


def apply_config(args: argparse.Namespace, parser: argparse.ArgumentParser, path: str,
                 *, extra: tuple[str, ...] = ()) -> dict[str, object]:
    """Fill ``args`` from the TOML file ``path``: every key the command line did not give
    (``args.given``), converted and checked as its flag's value would be. Returns the keys
    in ``extra`` (settings the caller handles itself, such as ``seeds``). Raises
    ``EvidenceError`` naming the file, the line and the key."""
    import difflib
    import tomllib

    from .._errors import EvidenceError

    try:
        text = Path(path).read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except OSError as exc:
        raise EvidenceError(f"cannot read the configuration file {path}: {exc.strerror}",
                            hint="check the path given to --config") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise EvidenceError(f"{path}: not valid TOML: {exc}",
                            hint="fix the line it names (https://toml.io)") from exc
    keys = config_keys(parser)
    given: set[str] = getattr(args, "given", set())
    found: dict[str, object] = {}
    for key, value in data.items():
        line = _line_of(text, key)
        where = f"{path}, line {line}" if line else path
        if key in extra:
            found[key] = value
            continue
        action = keys.get(key) or keys.get(key.replace("-", "_"))
        if action is None:
            close = difflib.get_close_matches(key, [*keys, *extra], n=1)
            raise EvidenceError(f"{where}: unknown key {key!r}", hint=(
                f"did you mean {close[0]!r}? " if close else "") + f"'{parser.prog} --help' "
                "lists the options; a key is a long flag's name with underscores")
        if action.dest in given:
            continue  # the command line wins
        try:
            setattr(args, action.dest, _config_value(action, value))
        except (ConfigError, argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise EvidenceError(f"{where}: {key} = {value!r}: {exc}",
                                hint=f"'{parser.prog} --help' says what "
                                f"{action.option_strings[-1]} takes") from exc
    return found


def _config_value(action: argparse.Action, value: object) -> object:
    """A TOML value as the flag's own parsing would have made it."""
    if action.nargs == 0:  # a switch: true means the flag was given
        if not isinstance(value, bool):
            raise ConfigError("expected true or false")
        return action.const if value else action.default
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_one_value(action, item) for item in items]
    if isinstance(value, list | dict):
        raise ConfigError("expected one value, not a list or a table")
    return _one_value(action, value)


def _one_value(action: argparse.Action, value: object) -> object:
    if isinstance(value, bool | list | dict):
        raise ConfigError(f"expected {action.metavar or 'a value'}")
    converted = action.type(str(value)) if callable(action.type) else str(value)
    if action.choices is not None and converted not in action.choices:
        raise ConfigError("expected one of " + ", ".join(map(str, action.choices)))
    return converted


def config_toml(args: argparse.Namespace, parser: argparse.ArgumentParser,
                extra: dict[str, object]) -> str:
    """The effective options as a configuration file (``--print-config``): what
    ``--config`` reads back to the same options. Unset options are left out."""
    values: dict[str, object] = dict(extra)
    for key, action in config_keys(parser).items():
        value = getattr(args, action.dest, None)
        if value is None or value == [] or (action.nargs == 0 and value == action.default):
            continue
        values[key] = True if action.nargs == 0 else value
    return "".join(f"{key} = {_toml(value)}\n" for key, value in values.items())


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):  # a pair parsed from "A=B" (--recrawl): its own form
        return _toml("=".join(map(str, value)))
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table (crawl's [[hosts]])
        return "{" + ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    # A TOML basic string takes JSON's escapes.
    return msgspec.json.encode(str(value)).decode()
