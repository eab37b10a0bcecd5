"""``python -m drvenus``: the same as the ``drvenus`` command."""

from drvenus.cli import main

main()
