"""The compiled parts: datastore/_kernel.c (suffix-array search and child splitting for
datastore/index.py) and decoder/_step.c (the decoder step's merge, selection, mask and acceptance
loops). Plain C API, no numpy headers; everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("datastore._kernel", ["datastore/_kernel.c"]),
                   Extension("decoder._step", ["decoder/_step.c"])])
