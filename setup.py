"""Build hook: the stage folders install as tpuflow.<stage>, and every subpackage is found, none listed by hand."""

from setuptools import find_packages, setup

STAGES = ("frontend", "lowering", "scheduler", "hwmodel", "codegen", "models")


def packages() -> list[str]:
    """tpuflow, each stage as tpuflow.<stage>, and every package below them (any folder with __init__.py)."""
    found = ["tpuflow"] + [f"tpuflow.{p}" for p in find_packages("tpuflow")]
    for stage in STAGES:
        found += [f"tpuflow.{stage}"] + [f"tpuflow.{stage}.{p}" for p in find_packages(stage)]
    return found


setup(packages=packages(), package_dir={"tpuflow": "tpuflow", **{f"tpuflow.{s}": s for s in STAGES}})
