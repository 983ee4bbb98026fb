"""The two commands a user types, ``python -m tinyflash.bench`` and ``python -m tinyflash.plots``:
their usage line shows that command, and every option says what it does."""

import argparse

import pytest

from tinyflash.measure import bench, plots


@pytest.mark.parametrize("main, prog", [(bench.main, "python -m tinyflash.bench"),
                                        (plots.main, "python -m tinyflash.plots")])
def test_help_names_the_command_and_every_option(main, prog, monkeypatch, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    usage = capsys.readouterr().out
    assert usage.startswith(f"usage: {prog} ")
    seen = {}

    def keep(self, args=None, namespace=None):
        seen["parser"] = self
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", keep)
    with pytest.raises(SystemExit):
        main([])
    undocumented = [a.dest for a in seen["parser"]._actions if not (a.help or "").strip()]
    assert not undocumented, f"{prog}: options without help: {undocumented}"
