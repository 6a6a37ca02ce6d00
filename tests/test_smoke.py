from moptd.catalog import CATALOG
from moptd.cli import main


def test_version(capsys):
    try:
        main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "moptd" in capsys.readouterr().out


def test_catalog_loads_every_domain():
    namespaces = {name.split(".")[0] for name in CATALOG}
    assert {"gpu", "node", "collector", "process"} <= namespaces
