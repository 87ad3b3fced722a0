"""The optional compiled parts; everything else is in pyproject.toml.

optional=True: where no C compiler is found the install goes on, and oncelog runs on the
pure-Python code they shortcut (protocol/records.py, client/producer/fast_append.py).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("oncelog.protocol._records", sources=["src/oncelog/protocol/_records.c"],
              depends=["src/oncelog/protocol/record_builder.h"], optional=True),
    Extension("oncelog.client.producer._append",
              sources=["src/oncelog/client/producer/_append.c"],
              include_dirs=["src/oncelog/protocol"],
              depends=["src/oncelog/protocol/record_builder.h"], optional=True),
])
