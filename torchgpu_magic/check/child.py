"""One check in a process of its own: ``python -m torchgpu_magic.check.child NAME RESULT.json``.

Runs the check ``NAME`` of :data:`~.registry.CHECKS` and writes its outcome as JSON to ``RESULT.json``;
what it prints (and any traceback) goes to the step's log. A :class:`~.outcome.Skip` is ``skipped`` with
its reason; any other exception is ``fail`` with its first line (the traceback is in the log). A process
that dies without writing the file (killed, aborted) is judged by the runner from its exit status.
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Optional, Sequence

from .outcome import FAIL, SKIPPED, Outcome, Skip
from .probe import Probe, first_line
from .registry import CHECKS


def run_check(name: str) -> Outcome:
    """The outcome of check ``name``, whatever it raised."""
    try:
        return CHECKS[name].run(Probe())
    except Skip as exc:
        return Outcome(SKIPPED, why=str(exc))
    except Exception as exc:  # noqa: BLE001 - a check that breaks is that check's failure, with its reason
        traceback.print_exc()
        return Outcome(FAIL, why=f"the check raised {first_line(exc)}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] not in CHECKS:
        print("usage: python -m torchgpu_magic.check.child NAME RESULT.json (NAME one of "
              f"{', '.join(CHECKS)})", file=sys.stderr)
        return 2
    outcome = run_check(args[0])
    print(outcome.line(), flush=True)
    Path(args[1]).write_text(outcome.to_json(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
