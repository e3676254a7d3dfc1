"""Class archives: one per JVM and jars, mapped only once made."""

from freshroute.class_archive import archive_path, making, mapping
from pipeline.session import archive_options


def test_an_archive_is_named_for_what_it_was_made_from_and_mapped_only_once_made(tmp_path):
    jars = ["spark-sql-kafka-0-10_2.13-4.2.0.jar", "kafka-clients-3.9.2.jar"]
    path = archive_path(tmp_path, "spark-driver", jars)
    assert path.parent == tmp_path and path.name.startswith("spark-driver-") and path.suffix == ".jsa"
    assert archive_path(tmp_path, "spark-driver", reversed(jars)) == path  # the jars' order does not matter
    assert archive_path(tmp_path, "spark-driver", jars[:1]) != path  # other jars: another archive
    assert mapping(path) == []
    path.write_bytes(b"")
    assert mapping(path) == [f"-XX:SharedArchiveFile={path}"]
    assert making(path)[0] == f"-XX:ArchiveClassesAtExit={path}"


def test_without_the_connector_the_session_starts_without_an_archive_and_says_what_is_missing_itself(tmp_path):
    assert archive_options(tmp_path) == ""
