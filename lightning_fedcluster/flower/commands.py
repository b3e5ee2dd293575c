"""``fedcluster flower ...``: ``new DIR`` writes a ready, secured Flower app (``template.py``);
``supernode [flower-supernode options]`` starts a SuperNode whose ClientApp stays loaded
(``supernode.py``)."""

from __future__ import annotations

import sys

USAGE = """usage: fedcluster flower new DIR
       fedcluster flower supernode [flower-supernode options] [--poll-interval S] [--busy-window S]
                                   [--fast-paths]

  new DIR      write a Flower app (pyproject.toml, fedcluster_app.py, certificates.sh, README.md)
  supernode    flower-supernode, with the ClientApp kept loaded between messages
"""


def main(argv: list[str]) -> int:
    """Run ``fedcluster flower <argv>``; the exit status."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "new":
        if len(rest) != 1 or rest[0].startswith("-"):
            print(
                "usage: fedcluster flower new DIR   (DIR: the new app's directory, e.g. my_app)",
                file=sys.stderr,
            )
            return 2
        from lightning_fedcluster.flower.template import write_app

        try:
            files = write_app(rest[0])
        except (FileExistsError, ValueError) as error:
            print(f"fedcluster flower new: {error}", file=sys.stderr)
            return 1
        print(f"wrote {', '.join(str(f) for f in files)}; next: cd {rest[0]} && ./certificates.sh")
        return 0
    if command == "supernode":
        from lightning_fedcluster.flower.supernode import main as supernode

        supernode(rest)
        return 0
    print(f"fedcluster flower: unknown command {command!r}\n{USAGE}", file=sys.stderr, end="")
    return 2
