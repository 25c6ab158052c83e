"""What every check uses: a real IPython shell with the extension loaded (the magics are driven as a user
drives them), what a cell printed and displayed, and the gates that say honestly why a check cannot
measure here (no CUDA build of torch, no GPU, no kernel runs, no ``nvidia-smi``, a missing library).

A check that needs the GPU calls :meth:`Probe.cuda` first: on a CPU build of torch, or one whose
``torch.cuda`` answers but cannot run a kernel (the tests' simulated H100), it raises
:class:`~torchgpu_magic.check.outcome.Skip` with the reason, so the summary says ``skipped: <why>`` and
never a pass that measured nothing.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import re
import shutil
import subprocess
from typing import Any, Iterator, Optional

from .outcome import Skip

MiB = 2**20
SMI_TIMEOUT_S = 30


class Probe:
    """The shell and the gates of one check's process. ``say`` writes a line to the step's log."""

    @staticmethod
    def say(text: str) -> None:
        print(text, flush=True)

    @functools.cached_property
    def shell(self) -> Any:
        """An ``InteractiveShell`` with torchgpu_magic loaded and ``torch`` imported in its namespace."""
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        shell.run_line_magic("colors", "nocolor")
        shell.run_line_magic("load_ext", "torchgpu_magic")
        shell.run_cell("import torch").raise_error()
        return shell

    def cell(self, code: str) -> Any:
        """Run ``code`` as a cell, raise what it raised, return its value."""
        result = self.shell.run_cell(code)
        result.raise_error()
        return result.result

    def captured(self, code: str) -> tuple:
        """Run ``code`` as a cell that may fail: ``(captured output, ExecutionResult)``, as a user would
        see it (stdout, and the displayed outputs' ``.data``)."""
        from IPython.utils.capture import capture_output

        with capture_output() as out:
            result = self.shell.run_cell(code, store_history=True)
        self.say(out.stdout.rstrip("\n"))
        return out, result

    @contextlib.contextmanager
    def displayed(self) -> Iterator[list]:
        """Collect the objects the shell displays inside the block (``display(obj)`` formats ``obj``
        through the shell's display formatter): what a magic showed, as an object, not its text."""
        shown: list = []
        formatter = self.shell.display_formatter
        original = formatter.format

        def record(obj: Any, *args: Any, **kwargs: Any) -> Any:
            shown.append(obj)
            return original(obj, *args, **kwargs)

        formatter.format = record
        try:
            yield shown
        finally:
            del formatter.format  # the instance attribute goes; the class's method is back

    # ---- gates ----------------------------------------------------------------------------------
    def cuda(self) -> int:
        """The current CUDA device's index, once a kernel has run on it; else :class:`Skip` with why."""
        import torch

        self.cuda_build("nothing here runs on a GPU")
        try:
            value = (torch.ones(1, device="cuda") + 1).item()
        except Exception as exc:  # noqa: BLE001 - any failure means no kernel runs here
            raise Skip(f"no CUDA kernel runs here: {first_line(exc)}") from exc
        if value != 2:
            raise Skip(f"a CUDA kernel computed 1 + 1 = {value}")
        return torch.cuda.current_device()

    @staticmethod
    def cuda_build(cpu_build: str = "it has no CUDA contexts to look at") -> None:
        """:class:`Skip` unless torch is a CUDA build that sees a GPU (no kernel is run, no context made);
        ``cpu_build`` says what a CPU build means for the check."""
        import torch

        if not torch.backends.cuda.is_built():
            raise Skip(f"this torch ({torch.__version__}) is not built with CUDA: {cpu_build}")
        if not torch.cuda.is_available():
            raise Skip(f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False)")

    @staticmethod
    def require(module: str) -> Any:
        """Import ``module`` or :class:`Skip` saying it is not installed."""
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            raise Skip(f"{module} is not installed here ({first_line(exc)})") from exc


def first_line(exc: BaseException, limit: int = 200) -> str:
    """``Type: the first line of the message`` (at most ``limit`` characters), for a one-line reason."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    if len(line) > limit:
        line = line[: limit - 3].rstrip() + "..."
    return f"{type(exc).__name__}: {line}".rstrip(": ")


def nvidia_smi(*args: str) -> str:
    """``nvidia-smi ARGS``' standard output; :class:`Skip` when there is no ``nvidia-smi`` on PATH."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise Skip("nvidia-smi is not on PATH")
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def smi_gpus() -> dict:
    """``{nvml index: (memory.used MiB, utilization.gpu %)}`` from one ``nvidia-smi`` call."""
    text = nvidia_smi("--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader,nounits")
    rows = (map(str.strip, line.split(",")) for line in text.strip().splitlines())
    return {int(index): (_number(used), _number(util)) for index, used, util in rows}


def smi_process_mib(pid: int) -> dict:
    """``{gpu uuid: MiB}`` NVML's compute process list gives ``pid`` (through ``nvidia-smi``); empty when it
    lists the pid nowhere (a container with its own PID namespace)."""
    text = nvidia_smi("--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits")
    rows = ([part.strip() for part in line.split(",")] for line in text.strip().splitlines())
    return {row[1]: _number(row[2]) for row in rows
            if len(row) == 3 and row[0].isdigit() and int(row[0]) == pid}


def _number(text: str) -> Optional[float]:
    """A figure nvidia-smi printed, or None for '[N/A]' and the like."""
    return float(text) if re.fullmatch(r"-?\d+(\.\d+)?", text) else None
