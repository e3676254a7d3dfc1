"""The Spark driver's class archive: one per JVM, PySpark and connector, mapped only when it is there."""

from pipeline.class_archive import archive_path, java_options
from pipeline.job import archive_options


def test_the_archive_is_named_for_its_jars_and_mapped_only_once_made(tmp_path):
    connector = [tmp_path / "spark-sql-kafka-0-10_2.13-4.2.0.jar", tmp_path / "kafka-clients-3.9.1.jar"]
    path = archive_path(tmp_path, connector)
    assert path.parent == tmp_path / "class-archive" and path.suffix == ".jsa"
    assert archive_path(tmp_path, reversed(connector)) == path  # the jars' order does not matter
    assert archive_path(tmp_path, connector[:1]) != path  # another connector: another archive
    assert java_options(tmp_path, connector) == ""
    path.parent.mkdir()
    path.write_bytes(b"")
    assert java_options(tmp_path, connector) == f" -XX:SharedArchiveFile={path}"


def test_without_the_connector_the_session_starts_without_an_archive_and_says_what_is_missing_itself(tmp_path):
    assert archive_options(tmp_path) == ""
