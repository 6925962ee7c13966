"""``python -m rl_triton_torchrl [--backend NAME] script.py [args...]``.

Runs an unchanged TorchRL script (as ``python script.py args...`` would) with
:func:`rl_triton_torchrl.enable` in effect. ``-m module`` runs a module instead of a file.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

import rl_triton_torchrl


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rl_triton_torchrl",
        description="Run a TorchRL script with its value estimators on rl_triton_core.",
    )
    parser.add_argument("--backend", default="auto", choices=rl_triton_torchrl.BACKENDS)
    parser.add_argument("-m", dest="module", action="store_true", help="run a module")
    parser.add_argument("target", help="the script (or, with -m, the module) to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    options = parser.parse_args(argv)
    rl_triton_torchrl.enable(options.backend)
    sys.argv = [options.target, *options.args]
    if options.module:
        runpy.run_module(options.target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(options.target)))
        runpy.run_path(options.target, run_name="__main__")


if __name__ == "__main__":
    main()
