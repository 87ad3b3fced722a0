"""DeleteTopics is crash-safe: a topic re-created under the same name always starts empty.

The partition directories are renamed aside first ("<topic>-<n>.<topic id>-delete", as Kafka
names them; the moment of deletion), then the metadata entry goes, then the directories, in
the background. These tests leave the broker's data directory as a crash at each point in
between would, and check what the next start makes of it. A directory that no deletion can
have left (its topic unknown, or another topic id) is set aside as "-stray", kept unread.
"""

from __future__ import annotations

import os
import time
import urllib.parse

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from support.brokers import create_topic, read_to_end

TOPIC = "reborn"


def produce(bootstrap: str, n: int, tag: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        producer.produce(TOPIC, value=tag + b"-%d" % i, partition=i % 2)
    assert producer.flush(30) == 0


def read_all(bootstrap: str) -> list[bytes]:
    return sorted(value for records in read_to_end(bootstrap, TOPIC, 2).values()
                  for _, value in records)


def delete_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([TOPIC])[TOPIC].result(30)


def metadata_entry(broker) -> str:
    return str(broker.data_dir / ".oncelog-metadata" /
               (urllib.parse.quote(f"topics/{TOPIC}", safe="") + ".json"))


def wait_gone(paths, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while any(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(p) for p in paths), [p for p in paths if os.path.exists(p)]


def test_delete_and_recreate_while_running_starts_empty(broker):
    create_topic(broker.bootstrap, TOPIC, 2)
    produce(broker.bootstrap, 20, b"old")
    delete_topic(broker.bootstrap)
    leftovers = [broker.data_dir / name for name in os.listdir(broker.data_dir)
                 if name.startswith(TOPIC)]
    assert all(str(p).endswith("-delete") for p in leftovers), leftovers
    create_topic(broker.bootstrap, TOPIC, 2)
    assert read_all(broker.bootstrap) == []
    produce(broker.bootstrap, 4, b"new")
    assert read_all(broker.bootstrap) == sorted(b"new-%d" % i for i in range(4))
    wait_gone(leftovers)


def topic_id(broker) -> str:
    import json

    with open(metadata_entry(broker), encoding="utf-8") as f:
        return json.load(f)["value"]["id"].replace("-", "")


def killed_with_data(broker) -> None:
    create_topic(broker.bootstrap, TOPIC, 2)
    produce(broker.bootstrap, 20, b"old")
    broker.kill()


def rename_as_deletion_does(broker) -> None:
    for p in range(2):
        os.rename(broker.data_dir / f"{TOPIC}-{p}",
                  broker.data_dir / f"{TOPIC}-{p}.{topic_id(broker)}-delete")


def test_crash_after_the_renames_rolls_the_deletion_forward(broker):
    """The crash came after the renames, before the metadata entry went: the deletion was
    decided, so the next start finishes it."""
    killed_with_data(broker)
    rename_as_deletion_does(broker)
    broker.start()
    assert not os.path.exists(metadata_entry(broker))
    assert not any(name.startswith(TOPIC) for name in os.listdir(broker.data_dir))
    assert "deleting topic reborn was cut short; finishing it" in broker.log_text()
    create_topic(broker.bootstrap, TOPIC, 2)
    assert read_all(broker.bootstrap) == []


def test_crash_after_the_metadata_entry_went_finishes_the_removal(broker):
    killed_with_data(broker)
    rename_as_deletion_does(broker)
    os.unlink(metadata_entry(broker))
    broker.start()
    assert not any(name.startswith(TOPIC) for name in os.listdir(broker.data_dir))


def test_a_directory_of_no_known_topic_is_set_aside_not_read_nor_deleted(broker):
    """What no deletion can leave (a lost metadata store, a copied directory): kept as
    "-stray" for an operator, and a topic created under its name starts empty."""
    killed_with_data(broker)
    os.unlink(metadata_entry(broker))
    broker.start()
    strays = [name for name in os.listdir(broker.data_dir) if name.endswith("-stray")]
    assert len(strays) == 2 and all(name.startswith(TOPIC) for name in strays)
    assert "belongs to no topic of this broker" in broker.log_text()
    create_topic(broker.bootstrap, TOPIC, 2)
    assert read_all(broker.bootstrap) == []


def test_directory_of_an_older_topic_of_the_same_name_is_not_read(broker):
    """A partition directory whose partition.metadata names another topic id is stale."""
    import shutil

    create_topic(broker.bootstrap, TOPIC, 2)
    produce(broker.bootstrap, 20, b"old")
    broker.stop()
    saved = broker.data_dir.parent / "saved"
    shutil.copytree(broker.data_dir / f"{TOPIC}-0", saved)
    broker.start()
    delete_topic(broker.bootstrap)
    create_topic(broker.bootstrap, TOPIC, 2)
    broker.stop()
    # The old directory is back under the new topic's name, as a restored backup might be.
    shutil.rmtree(broker.data_dir / f"{TOPIC}-0", ignore_errors=True)
    os.rename(saved, broker.data_dir / f"{TOPIC}-0")
    broker.start()
    assert read_all(broker.bootstrap) == []
    assert "belongs to no topic of this broker" in broker.log_text()
