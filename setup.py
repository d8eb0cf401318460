"""The one compiled part: datastore/_kernel.c (suffix-array search and child splitting for
datastore/index.py). Plain C API, no numpy headers; everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("datastore._kernel", ["datastore/_kernel.c"])])
