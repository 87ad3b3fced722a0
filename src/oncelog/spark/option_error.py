"""The one error a bad option of format("oncelog") raises, apart from the options' parsers so
that each of them (options.py, source_options.py) can raise it."""


class OptionError(ValueError):
    """A bad option of format("oncelog"); the message names it."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f'format("oncelog") option {option}: {problem}')
        self.option = option
