"""``python -m outbox.transitions postgresql|sqlite``: print every statement the table renders.

``--write``: write them to ``outbox/transitions/sql/`` instead, for a commit.
Runs with the project's settings when ``DJANGO_SETTINGS_MODULE`` names them,
else with the least Django needs to load the models: nothing here connects.
"""

from __future__ import annotations

import argparse
import os

import django
from django.conf import settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m outbox.transitions", description=__doc__)
    parser.add_argument("database", nargs="?", choices=("postgresql", "sqlite"))
    parser.add_argument("--write", action="store_true", help="write outbox/transitions/sql/")
    args = parser.parse_args(argv)
    if not args.write and args.database is None:
        parser.error("name a database, or --write")
    if not settings.configured and "DJANGO_SETTINGS_MODULE" not in os.environ:
        settings.configure(INSTALLED_APPS=["outbox"])
    django.setup()
    from .dump import dump, write

    if args.write:
        for path in write():
            print(f"wrote {path}")
    else:
        print(dump(args.database), end="")


if __name__ == "__main__":
    main()
