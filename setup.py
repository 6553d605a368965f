"""The compiled parts of agentspec-sdk: the suffix trees the structure drafter drives
(`agentspec_sdk.drafting._trees`, C++ in csrc/suffix_trees) and its in-segment lookup
(`agentspec_sdk.drafting._lookup`, csrc/lookup). Everything else is in pyproject.toml."""

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup

setup(ext_modules=[
    Pybind11Extension(
        "agentspec_sdk.drafting._trees",
        ["csrc/suffix_trees/forest.cc", "csrc/suffix_trees/suffix_tree.cc"],
        include_dirs=["csrc/suffix_trees"],
        cxx_std=20,
        extra_compile_args=["-O3", "-DNDEBUG"],
    ),
    Pybind11Extension(
        "agentspec_sdk.drafting._lookup",
        ["csrc/lookup/corpus_index.cc"],
        cxx_std=20,
        extra_compile_args=["-O3", "-DNDEBUG"],
    ),
])
