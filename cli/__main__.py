"""``python -m cli``: the same as the ``terrain`` command."""
from cli.main import main

main()
