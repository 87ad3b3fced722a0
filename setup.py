"""The optional compiled record codec; everything else is in pyproject.toml.

optional=True: where no C compiler is found the install goes on, and oncelog runs on the
pure-Python codec in protocol/records.py.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("oncelog.protocol._records",
                             sources=["src/oncelog/protocol/_records.c"],
                             optional=True)])
