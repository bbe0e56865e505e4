"""Subcommands of the ``pystreams`` CLI, one module each.

A command module exposes ``configure(parser)`` and ``run(args) -> int`` and keeps heavy imports
inside ``run``; ``pystreams.cli.COMMANDS`` maps subcommand names to these modules.
"""
