"""One module per subcommand of the ``freshkey`` command line."""

from pathlib import Path
from typing import Annotated

import typer

EnvFile = Annotated[
    Path | None, typer.Option("--env-file", help="Settings file of FRESHKEY_* lines (env wins over it).")
]
