"""Env throughput (JSON lines): `robotrl envs bench`, which lives in the package (robotrl/envs/benchmark.py, whose
docstring says what each field measures) so that an installed wheel runs it too.

    .venv/bin/python bench/envs.py --tasks Reach --num-envs 2 8 32
"""

import tyro

from robotrl.envs.benchmark import BenchConfig, main

if __name__ == "__main__":
    main(tyro.cli(BenchConfig))
