from tools import configdoc


def test_configuration_reference_is_current():
    assert configdoc.DOC.read_text() == configdoc.render(), "run: python -m tools.configdoc"


def test_every_component_setting_is_documented():
    text = configdoc.render()
    for flag in ("--node-id", "--rest-port", "--trigger-ms", "--redis-url", "--bootstrap-servers"):
        assert f"`{flag}`" in text
