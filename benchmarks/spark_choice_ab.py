"""spark_variants.py with deepspark's choice of round kinds as an older commit made it, in the same
process and in turns with the current code: a configuration labelled ``<name>-old`` gets the
``_choose`` of the deepspark.py given by ``--old FILE`` (saved beforehand, e.g. ``git show
a696c11:plugins_builtin/drafters/deepspark/drafter.py > benchmarks/old_deepspark.py``), bound to its built drafter;
the rest of the drafter is the current code's. Session 55 compared its choice for a request alone
with session 54's this way (benchmarks.md):

    python3 benchmarks/spark_choice_ab.py --old benchmarks/old_deepspark.py --device sm90 --kv-gb 2 \\
        --batch 1 --prompts 16 --repeats 3 none= ds=deepspark ds-old=deepspark
"""
from __future__ import annotations

import importlib.util
import sys
import types

import spark_variants


def main() -> None:
    at = sys.argv.index("--old")
    path = sys.argv[at + 1]
    del sys.argv[at:at + 2]
    spec = importlib.util.spec_from_file_location("deepinfer_builtin.deepspark_old", path)
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old  # (its dataclasses look their module up)
    spec.loader.exec_module(old)
    build = spark_variants.build

    def build_old(config: str, device: str, kv_gb: float | None):
        label, llm, acc, choices = build(config, device, kv_gb)
        if label.endswith("-old"):
            d = llm.engine.drafter
            d._choose = types.MethodType(old.DeepSparkDrafter._choose, d)
        return label, llm, acc, choices

    spark_variants.build = build_old
    spark_variants.main()


if __name__ == "__main__":
    main()
