"""Command-line options that carry a secret: read from an environment variable, warned about when typed.

Anything on a command line is in the process table, where every user of the machine reads it with
``ps``; the environment of a process is not. So each secret option defaults to an environment
variable that its ``--help`` names, and a value given on the command line still works but logs a
one-line warning saying so (never the value itself).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)


class _SecretAction(argparse.Action):
    """Store the value like ``store`` does, and warn that it is visible in the process table."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, env: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.env = env

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        logger.warning("%s on the command line is visible to every user of this machine (ps); set %s in the "
                       "environment instead", option_string or self.dest, self.env)
        setattr(namespace, self.dest, values)


def add_secret_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, *, env: str,
                        help: str, default: str | None = None) -> argparse.Action:
    """Add ``flag``, a secret whose default is ``$env`` (else ``default``); ``--help`` names the variable.

    The environment is read when the option is added, so build the parser when the command runs.
    The help never shows the value.
    """
    return parser.add_argument(flag, action=_SecretAction, env=env, default=os.environ.get(env) or default,
                               metavar="SECRET",
                               help=f"{help} (default: ${env}; given here, it shows in `ps` to every local user)")
