import pytest

from moptd.catalog import CATALOG
from moptd.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert "moptd" in capsys.readouterr().out


def test_catalog_loads_every_domain():
    namespaces = {name.split(".")[0] for name in CATALOG}
    assert {"gpu", "node", "collector", "process"} <= namespaces
